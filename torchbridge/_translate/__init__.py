"""`tb.translate`: a torch module as pure TF ops, no torch at run time.

A separate system: `torch.export` gives an ATen program (`_export`), which
`_fx_to_tf` walks, node by node, through the ATen tables (`_aten/`);
`_translated` checks parity. It shares only the variables with the bridge
and never imports the call path.

May import: _frameworks.
"""
