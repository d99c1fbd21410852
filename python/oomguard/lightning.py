"""A Lightning callback: saves a checkpoint on oomguard's request, on every
rank at the same step, where Lightning's own checkpoints go, and stops the
fit after a ``checkpoint_and_exit`` request.

Under ``oomguard run`` every ``Trainer`` gets it without code (see
``oomguard._auto``); add it by hand elsewhere::

    from oomguard.lightning import OomguardCallback
    trainer = Trainer(callbacks=[OomguardCallback()])
"""

import os
import sys

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
                _save(trainer, path)
            except Exception:
                ok = False
            if ok:
                _saved_for_model_checkpoints(trainer, path)
            g.checkpointed([path], ok=ok)
            if g.should_exit():
                trainer.should_stop = True
                if getattr(trainer, "is_global_zero", True):
                    sys.stderr.write(
                        "oomguard: stopping the fit after the checkpoint at step {} ({})\n".format(
                            step, g.stop_reason or "asked to stop"
                        )
                    )
                    sys.stderr.flush()

    return OomguardCallback


def no_second_requeue(trainer):
    """Turns off Lightning's own SLURM auto-requeue under oomguard.

    With it on, every rank's SIGUSR1 handler saves inside the handler and
    rank 0 runs ``scontrol requeue``, and its SIGTERM handler ignores the
    SIGTERM. Under oomguard the time limit's warning is oomguard's to serve
    (every rank saves the step the vote agrees on; the batch script
    requeues), so where the ranks get the signal too (``proctrack/linuxproc``,
    ``scancel --full``) Lightning would save and requeue a second time, and
    oomguard's own SIGTERM, its last word before SIGKILL, would be ignored.
    """
    connector = getattr(trainer, "_accelerator_connector", None)
    env = getattr(connector, "cluster_environment", None)
    if type(env).__name__ == "SLURMEnvironment" and getattr(env, "auto_requeue", False):
        env.auto_requeue = False


def _save(trainer, path):
    """A full checkpoint (the optimizer's state too: a resume needs it),
    asked for by name so Lightning does not log that it chose; a Lightning
    too old for the argument saves a full one anyway."""
    try:
        trainer.save_checkpoint(path, weights_only=False)
    except TypeError:
        trainer.save_checkpoint(path)


def _saved_for_model_checkpoints(trainer, path):
    """Tells the fit's ``ModelCheckpoint`` callbacks that this step is
    saved, so none saves it again as ``…-v1.ckpt`` when the fit ends (twice
    the time and the disk at the worst moment); a ``last.ckpt`` the user
    asked for (``save_last``) is still made, of this save. Best effort:
    these are Lightning's internals, and any failure leaves Lightning as
    it was."""
    for cb in getattr(trainer, "checkpoint_callbacks", None) or []:
        try:
            if not hasattr(cb, "_last_global_step_saved"):
                continue
            cb._last_global_step_saved = trainer.global_step
            cb._last_checkpoint_saved = path
            if getattr(cb, "save_last", None):
                cb._save_last_checkpoint(trainer, cb._monitor_candidates(trainer))
        except Exception:
            pass


def checkpoint_dir(trainer):
    """Where Lightning puts checkpoints: the ``ModelCheckpoint``'s directory,
    else ``<default_root_dir>/checkpoints``."""
    cb = getattr(trainer, "checkpoint_callback", None)
    d = getattr(cb, "dirpath", None)
    if d:
        return str(d)
    return os.path.join(str(trainer.default_root_dir), "checkpoints")


OomguardCallback = callback_class(_Base)
