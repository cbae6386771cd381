# mmseg's default runtime, with PosMLP registered and its training runtime
# switched on (posmlp_dense.openmmlab.runtime). mmseg keeps its hooks with the
# schedule: the checkpoint hook is set in ./schedules/posmlp_adamw_*.py.
_base_ = 'mmseg::_base_/default_runtime.py'

custom_imports = dict(
    imports=['posmlp_dense', 'posmlp_dense.openmmlab.runtime'],
    allow_failed_imports=False)
