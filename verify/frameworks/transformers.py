"""Hugging Face Transformers: its Trainer and TrainingArguments, HfArgumentParser, and `from_pretrained`.

Source: TrainingArguments' `fp16=True`/`bf16=True` (or `--fp16`/`--bf16` through HfArgumentParser) switch on the
mixed precision the Trainer does through accelerate (torch.autocast, torch.amp.GradScaler for fp16);
`trainer.train()` trains; `transformers.set_seed` seeds every generator. `from_pretrained` takes a device
(`device_map=`), a dtype (`torch_dtype=`), CUDA-only attention kernels and bitsandbytes quantization as keywords.

Runtime: `from_pretrained` builds the model under `torch.device("meta")`, makes its non-persistent buffers anew and
loads the safetensors file into it; with `device_map="auto"` it names the GPU by its index, `torch.device(0)`
(verify/devices/setup.py keeps torch's own device factories for the first, the CUDA stand-in answers the second:
tests/verify/test_framework_loads.py).
"""

from __future__ import annotations

from verify.frameworks._framework import BF16, FP16, AmpSwitch, Framework

FRAMEWORK = Framework(
    name="Transformers",
    amp=(
        AmpSwitch(
            builds=("TrainingArguments",),
            subclasses_named_so=True,  # Seq2SeqTrainingArguments, and the TRL trainers' configs
            keywords=("fp16", "bf16"),
            mixed={("fp16", True): FP16, ("bf16", True): BF16},
            options=("--fp16", "--bf16"),
            parsers={"HfArgumentParser": "TrainingArguments"},  # reads --fp16 and --bf16 into TrainingArguments
            switch_on="--fp16 or --bf16 of TrainingArguments",
            fp32_when_built_as=("",),  # a name no other library uses
        ),
    ),
    seed_everything=("transformers.set_seed",),
    trainer_methods=("train",),
)
# `from_pretrained`'s keywords (accelerate's dispatch takes the first too): a device, or a dict of modules to devices;
# the dtype its weights load in; the attention kernels it uses; 8/4-bit loading through bitsandbytes.
DEVICE_KEYWORDS = ("device_map",)
DTYPE_KEYWORDS = ("torch_dtype",)
FLASH_ATTENTION = {"attn_implementation": "flash_attention_2", "use_flash_attention_2": True}
QUANTIZED_LOADING = ("load_in_8bit", "load_in_4bit")
QUANTIZATION_CONFIGS = ("transformers.BitsAndBytesConfig", "transformers.utils.quantization_config")
