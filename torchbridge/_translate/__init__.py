"""`tb.translate`: a torch module as pure TF ops, no torch at run time.

Pure ATen -> TF: `torch.export` gives an ATen program (`_export`), which
`_fx_to_tf` walks, node by node, through the ATen tables (`_aten/`);
`_translated` is `tb.translate`, checked against torch with the one
tolerance table (`_tolerance`); a limit of the translation is a
`Refusal` (`_refusal`). The runners (`_runners`) run its translations of
graph calls; it knows no module, no runner and no call path.

May import: _frameworks.
"""
