# AdamW parameter groups for PosMLP (the schedules in ./schedules/ use them):
# no weight decay for norms, biases, and the positional parameters of the
# gates (GQPE centres and spreads, LRPE tables, per-position biases, LRPE's
# token matrix, absolute position embedding).
posmlp_paramwise_cfg = dict(
    norm_decay_mult=0.0,
    bias_decay_mult=0.0,
    custom_keys={
        'attention_centers': dict(decay_mult=0.0),
        'attention_spreads': dict(decay_mult=0.0),
        'relative_position_bias_table': dict(decay_mult=0.0),
        'token_proj_n_bias': dict(decay_mult=0.0),
        'token_proj_n_weight': dict(decay_mult=0.0),
        'absolute_pos_embed': dict(decay_mult=0.0),
    })
