"""Zero code for the common case: under ``oomguard run`` the start-up hook
imports this module, which waits (a finder on ``sys.meta_path`` that never
finds anything itself) for the job to import a Lightning or Hugging Face
``Trainer``. Once that module has run, its ``Trainer`` gets oomguard's
callback in ``__init__``, and ``fit``/``train`` resume from the checkpoint
the previous attempt reported when the job did not name one.

Nothing is imported before the job imports it, and any failure leaves the
job exactly as it would have been without oomguard.
"""

import functools
import os
import sys

_TARGETS = {
    "lightning.pytorch.trainer.trainer": ("lightning", "lightning.pytorch.callbacks"),
    "pytorch_lightning.trainer.trainer": ("lightning", "pytorch_lightning.callbacks"),
    "transformers.trainer": ("transformers", None),
}


def install():
    if any(isinstance(f, _TrainerWatch) for f in sys.meta_path):
        return
    for name in _TARGETS:
        module = sys.modules.get(name)
        if module is not None:
            _patch(name, module)
    sys.meta_path.insert(0, _TrainerWatch())


def _resume_path():
    from . import guard

    return guard().resume_path()


def _patch(name, module):
    trainer = getattr(module, "Trainer", None)
    if trainer is None or getattr(trainer, "_oomguard_patched", False):
        return
    framework, callbacks_module = _TARGETS[name]
    if framework == "lightning":
        base = __import__(callbacks_module, fromlist=["Callback"]).Callback
        from .lightning import callback_class

        from .lightning import no_second_requeue

        cls = callback_class(base)

        def add(self):
            self.callbacks.append(cls())
            no_second_requeue(self)

        _wrap_init(trainer, add)
        # fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)
        _wrap_resume(trainer, "fit", "ckpt_path", 4)
    else:
        from .hf import OomguardCallback

        _wrap_init(trainer, lambda self: self.add_callback(OomguardCallback()))
        # train(resume_from_checkpoint, ...)
        _wrap_resume(trainer, "train", "resume_from_checkpoint", 0)
    trainer._oomguard_patched = True


def _wrap_init(cls, add):
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            add(self)
        except Exception:
            pass

    cls.__init__ = __init__


def _wrap_resume(cls, method, keyword, position):
    original = getattr(cls, method, None)
    if original is None:
        return

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        if len(args) <= position and kwargs.get(keyword) is None:
            try:
                path = _resume_path()
            except Exception:
                path = None
            if path:
                kwargs[keyword] = path
        return original(self, *args, **kwargs)

    setattr(cls, method, wrapper)


class _TrainerWatch:
    """Notices the trainer modules being imported; finds nothing itself."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(fullname, path, target)
            except Exception:
                return None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec

    def invalidate_caches(self):
        pass


class _PatchingLoader:
    """The real loader, plus the patch once the module has run."""

    def __init__(self, inner, name):
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            _patch(self._name, module)
        except Exception:
            pass

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


if os.environ.get("OOMGUARD_CONTROL"):
    install()
