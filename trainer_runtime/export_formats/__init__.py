"""The folder formats ``export.py`` writes besides one ``torch.save`` file (DCP, safetensors),
and the interface they read the checkpoint's weights through, a few tensors at a time (each
checkpoint format's source lives with that format's reader, under ``resume/``).
"""
