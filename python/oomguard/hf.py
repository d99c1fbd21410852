"""A Hugging Face ``TrainerCallback``: on oomguard's request every rank
agrees at a step end, the Trainer saves its own ``checkpoint-<step>`` in
``output_dir``, and after a ``checkpoint_and_exit`` request training stops.

Under ``oomguard run`` every ``Trainer`` gets it without code; by hand::

    from oomguard.hf import OomguardCallback
    trainer = Trainer(..., callbacks=[OomguardCallback()])
"""

import os

from transformers import TrainerCallback

from . import guard


class OomguardCallback(TrainerCallback):
    def __init__(self, guard_=None):
        self.guard = guard_ or guard("transformers")
        self._saving = False

    def on_step_end(self, args, state, control, **kwargs):
        g = self.guard
        if g.active and not self._saving and g.step(state.global_step, epoch=state.epoch):
            self._saving = True
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        if not self._saving:
            return control
        self._saving = False
        path = os.path.join(args.output_dir, "checkpoint-{}".format(state.global_step))
        self.guard.checkpointed([path], ok=os.path.isdir(path))
        if self.guard.should_exit():
            control.should_training_stop = True
        return control
