"""A Lightning callback: saves a checkpoint on oomguard's request, on every
rank at the same step, where Lightning's own checkpoints go, and stops the
fit after a ``checkpoint_and_exit`` request.

Under ``oomguard run`` every ``Trainer`` gets it without code (see
``oomguard._auto``); add it by hand elsewhere::

    from oomguard.lightning import OomguardCallback
    trainer = Trainer(callbacks=[OomguardCallback()])
"""

import os

from . import guard

try:  # Lightning 2.x, then the older package name.
    from lightning.pytorch.callbacks import Callback as _Base
except ImportError:  # pragma: no cover - depends on what is installed
    from pytorch_lightning.callbacks import Callback as _Base


def callback_class(base):
    """The callback built on ``base`` (``lightning.pytorch`` or
    ``pytorch_lightning``'s ``Callback``)."""

    class OomguardCallback(base):
        def __init__(self, guard_=None):
            super().__init__()
            self.guard = guard_ or guard("lightning")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            g = self.guard
            if not g.active:
                return
            step = trainer.global_step
            if not g.step(step, epoch=trainer.current_epoch):
                return
            path = os.path.join(
                checkpoint_dir(trainer), "epoch={}-step={}.ckpt".format(trainer.current_epoch, step)
            )
            ok = True
            try:
                trainer.save_checkpoint(path)
            except Exception:
                ok = False
            g.checkpointed([path], ok=ok)
            if g.should_exit():
                trainer.should_stop = True

    return OomguardCallback


def checkpoint_dir(trainer):
    """Where Lightning puts checkpoints: the ``ModelCheckpoint``'s directory,
    else ``<default_root_dir>/checkpoints``."""
    cb = getattr(trainer, "checkpoint_callback", None)
    d = getattr(cb, "dirpath", None)
    if d:
        return str(d)
    return os.path.join(str(trainer.default_root_dir), "checkpoints")


OomguardCallback = callback_class(_Base)
