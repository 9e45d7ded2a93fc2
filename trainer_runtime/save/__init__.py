"""Saving a checkpoint: what a rank file holds and how it is written, the commit that makes a
checkpoint exist (manifest, fence), and the policy around each save (when, under which name,
the emergency and survivor saves).
"""
