"""Trainer integrations: zerodoc in training loops you did not write.

One module per framework, each importing its framework only when it is imported itself
(importing ``zerodoc`` imports none of them):

- ``zerodoc.integrations.hf``: ``ZerodocCallback`` for the Hugging Face ``Trainer``;
- ``zerodoc.integrations.accelerate``: ``attach(accelerator)`` after ``accelerator.prepare``;
- ``zerodoc.integrations.lightning``: ``ZerodocCallback`` for the Lightning ``Trainer``.

torchtitan needs no module: its wiring is two lines in its train entry point
(docs/integrations.md). Each integration hands ``zerodoc.attach()`` the model and optimizer
*as the framework prepared them* (sharded / wrapped), and closes the monitor when the
framework says training is over.
"""
