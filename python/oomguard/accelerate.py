"""accelerate has no signal handling of its own; this helper gives an
accelerate loop oomguard's checkpoint on request::

    from oomguard.accelerate import AccelerateGuard
    og = AccelerateGuard(accelerator, "checkpoints")
    accelerator.load_state(og.resume_path()) if og.resume_path() else None
    for step, batch in enumerate(loader, 1):
        ...
        if og.step(step) and og.should_exit():
            break

The ranks agree through the process group accelerate set up; the state goes
through ``accelerator.save_state`` into ``<output_dir>/step_<n>``.
"""

import os

from . import guard


class AccelerateGuard:
    def __init__(self, accelerator, output_dir):
        self.accelerator = accelerator
        self.output_dir = output_dir
        self.guard = guard("accelerate")

    def step(self, step, epoch=None):
        """Call once per step on every process. True when a checkpoint was
        saved at this step."""
        if not self.guard.step(step, epoch=epoch):
            return False
        path = os.path.join(self.output_dir, "step_{}".format(step))
        ok = True
        try:
            self.accelerator.save_state(path)
        except Exception:
            ok = False
        self.guard.checkpointed([path], ok=ok)
        return True

    def should_exit(self):
        return self.guard.should_exit()

    def resume_path(self):
        return self.guard.resume_path()
