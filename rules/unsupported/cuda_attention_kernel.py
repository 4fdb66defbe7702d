from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, frameworks, matches, string_value

_KERNELS = ("flash_attn", "xformers.ops")


class CudaAttentionKernel(PortRule):
    """Report FlashAttention / xformers attention kernels and Hugging Face's "flash_attention_2" switch.

    ## What it does
    Reports each call into `flash_attn` (`flash_attn_func`, `flash_attn_varlen_func`...) or `xformers.ops`
    (`memory_efficient_attention`...), and each `attn_implementation="flash_attention_2"` or
    `use_flash_attention_2=True` argument.

    ## Why
    These are CUDA kernels; the flash_attn package does not run on an NPU. The NPU fused attention is
    `torch_npu.npu_fusion_attention` (its layout and mask arguments differ), and
    `torch.nn.functional.scaled_dot_product_attention` or Hugging Face's `attn_implementation="sdpa"` are portable.

    ## Safety
    Report-only: tensor layouts (`BSND` vs `BNSD`), masks and dropout must be mapped by hand.

    ## References
    <https://github.com/Ascend/pytorch/issues/25>; <https://github.com/huggingface/transformers/pull/36383>.
    """

    CODE = "UNS005"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("flash_attn", "flash_attention_2", "xformers")
    EXAMPLES = (
        Flag(
            """
            from flash_attn import flash_attn_func
            import xformers.ops as xops
            from transformers import AutoModelForCausalLM
            out = flash_attn_func(q, k, v, causal=True)  # (B, S, H, D)
            out = xops.memory_efficient_attention(q, k, v)
            model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="flash_attention_2")
            """,
            lines=[4, 5, 6],
        ),
        Unchanged(
            """
            import torch.nn.functional as F
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="sdpa")
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = self.name_under(node.func, *_KERNELS)
        if name is None and not any(_asks_for_flash_attention(arg) for arg in node.args):
            return
        self.report(
            node,
            f"{name or 'FlashAttention 2'} is a CUDA-only attention kernel",
            'use torch.nn.functional.scaled_dot_product_attention (Hugging Face: attn_implementation="sdpa") or '
            "torch_npu.npu_fusion_attention (mind its layout and mask arguments)",
            severity=Severity.WARNING,
        )


def _asks_for_flash_attention(arg: cst.Arg) -> bool:
    """Whether `arg` is a Hugging Face switch to FlashAttention 2: the keyword's value is the one that asks for it."""
    if arg.keyword is None or arg.keyword.value not in frameworks.transformers.FLASH_ATTENTION:
        return False
    wanted = frameworks.transformers.FLASH_ATTENTION[arg.keyword.value]
    return matches(arg.value, m.Name("True")) if wanted is True else string_value(arg.value) == wanted
