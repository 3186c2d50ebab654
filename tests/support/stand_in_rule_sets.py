"""The stand-in's rule sets the model-level tests run under: torch 2.13 (command buffers), and
2.14 and 2.15 in both recording modes."""

from inductor_xpugraph.trees.backends.xpu_recording import COMMAND_BUFFER, NATIVE

#: (release, recording mode).
RULE_SETS = [
    ("2.13", COMMAND_BUFFER),
    ("2.14", COMMAND_BUFFER),
    ("2.14", NATIVE),
    ("2.15", COMMAND_BUFFER),
    ("2.15", NATIVE),
]
RULE_SET_IDS = [f"{release}-{mode}" for release, mode in RULE_SETS]
