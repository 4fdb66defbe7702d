"""Errors an emulation raises as the real device would (an index past its devices, an op its autocast refuses, a
name its module lacks): the script's errors. Every other AttributeError, RuntimeError or NotImplementedError that an
emulation raises in its own code is the emulation's failure, which the run records as verify's (exit 2:
verify/capture/session.py). No imports: the CPU's autocast casts (autocast_policy) raise these outside an emulation
too, where target.py refuses to load."""


def as_the_device(error: BaseException) -> BaseException:
    """`error`, marked as one the real device raises too."""
    error.npu_port_as_the_device = True
    return error


def raised_as_the_device(error: BaseException) -> bool:
    return getattr(error, "npu_port_as_the_device", False)
