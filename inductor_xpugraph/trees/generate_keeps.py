"""Whether the caller is Hugging Face ``generate``, which keeps outputs across steps.

Note [What generate keeps]
--------------------------
Each decode step of ``generate`` is a generation of the tree, and what a generation handed
out goes stale when it ends (Note [Retiring held outputs] in ``handed_out``). ``generate``
itself keeps outputs across steps where the user cannot clone them:

- ``output_hidden_states=True``, ``output_attentions=True``, ``output_scores`` or
  ``output_logits`` with ``return_dict_in_generate=True``: every step's tensors, returned
  at the end;
- assisted generation: the draft model's cache (a ``DynamicCache`` whose tensors are outputs
  of the draft's graphs) lives across the target's steps, and ``crop`` reads it after them.

So when a generation ends inside ``generate`` (a frame of
``transformers.generation.utils``'s ``generate`` is on the stack), whatever the caller still
holds is *handed over* (copied out of the pool, one device copy per block) instead of made
stale: what upstream's ``cudagraph_trees_generation_cloning = "user_visible"`` does for every
caller, and ``config.generation_cloning`` here. The copy is paid only for what is held: a
plain decode loop holds nothing when its step ends (``generate`` drops each step's outputs).
Nothing is asked where transformers' generate is not imported; where it is, the held outputs
are counted at each step's end (a reference count per output object of the step), and the
stack is looked at only when something is held. Outside ``generate`` the rule is upstream's:
a held output goes stale, and its message names the setting.
"""

from __future__ import annotations

import sys

# The module and function whose frame marks a call of Hugging Face generate.
GENERATE_MODULE = "transformers.generation.utils"
GENERATE_FUNCTION = "generate"
# How far up the stack to look: generate calls the compiled forward through a few frames
# (its decoding method, the model's __call__, Dynamo's and AOT's wrappers, the tree's).
_MAX_DEPTH = 64


def generate_imported() -> bool:
    """Whether Hugging Face generate is imported at all: where it is not, nothing is asked."""
    return GENERATE_MODULE in sys.modules


def inside_generate() -> bool:
    """Whether a Hugging Face ``generate`` call is on the current thread's stack."""
    frame = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == GENERATE_FUNCTION and frame.f_globals.get("__name__") == GENERATE_MODULE:
            return True
        frame = frame.f_back
    return False
