"""Gate units: PoSGU with GQPE or LRPE, and gMLP's SGU."""
from .base import GateUnit
from .gqpe import GQPE
from .lrpe import LRPE
from .posgu import PoSGU
from .sgu import SGU


def build_gate(gate: str, channels: int, window, groups: int,
               pos_only: bool = True, generalized: bool = True) -> GateUnit:
    """Build the gate unit of one block (``gate`` is 'gqpe'/'lrpe'/'sgu')."""
    if gate == 'sgu':
        return SGU(channels, window)
    return PoSGU(channels, window, groups, encoding=gate, pos_only=pos_only,
                 generalized=generalized)


__all__ = ['GateUnit', 'GQPE', 'LRPE', 'PoSGU', 'SGU', 'build_gate']
