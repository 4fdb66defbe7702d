"""npu-port's device emulation, shared by its two test doubles: the EMULATED NPU (the stand-in torch_npu beside this
package) and the EMULATED CUDA, the CUDA stand-in a reference runs on where there is no GPU (`cuda.install()`).

target: where the emulated device computes and how device arguments are sent there; patches: what torch calls are
wrapped for it; device_api: the torch.<device> module that answers for it; autocast_policy: CUDA's autocast op lists
on CPU autocast. Like the stand-in torch_npu it loads only in a process that `verify` started (target refuses
otherwise); the bootstrap loads it from this folder, so a reference script can never import it by accident.
"""
