"""torch.compile (and dynamo's older `torch._dynamo.optimize`).

Source: a call or a bare decorator compiles; on the NPU its inductor path goes through triton-ascend (UNS007).

Runtime: dynamo compiles nothing while a dispatch mode that is not torch's own is on the stack, as verify's capture
is, so the compiled model runs eagerly, op by op (verify/capture/compile_calls.py counts the calls and the graphs);
what it returns for a module wraps the module, which verify's module paths look through.
"""

from __future__ import annotations

from verify.frameworks._framework import Framework

FRAMEWORK = Framework(name="torch.compile")
COMPILE_CALLS = ("torch.compile", "torch._dynamo.optimize")
# What torch.compile returns for a module, and the attribute that holds the module.
WRAPPER_CLASS, WRAPPED_MODULE = "OptimizedModule", "_orig_mod"
