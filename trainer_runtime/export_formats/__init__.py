"""The folder formats ``export.py`` writes besides one ``torch.save`` file (DCP, safetensors),
and the checkpoint's weights they read, a few tensors at a time.
"""
