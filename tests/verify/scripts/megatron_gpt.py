"""A tiny megatron-core GPT, tensor parallel 2, written for torchrun on GPUs, in the shape of megatron-core's own
example (examples/run_simple_mcore_train_loop.py): nccl, Megatron's CUDA RNG tracker (model_parallel_cuda_manual_seed),
its GPT built from a TransformerConfig, its forward-backward schedule, torch's Adam. Both ranks of the tensor-parallel
group read the same batches."""
import os
from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from megatron.core.transformer.transformer_config import TransformerConfig

SEQ, MBS, VOCAB = 16, 4, 100


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    model_parallel_cuda_manual_seed(123)
    config = TransformerConfig(num_layers=2, hidden_size=12, num_attention_heads=4, use_cpu_initialization=True,
                               pipeline_dtype=torch.float32)
    model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                     max_sequence_length=SEQ).cuda()
    generator = torch.Generator().manual_seed(0)

    def batches():
        while True:
            tokens = torch.randint(0, VOCAB, (MBS, SEQ + 1), generator=generator)
            yield {"tokens": tokens[:, :-1], "labels": tokens[:, 1:],
                   "position_ids": torch.arange(SEQ).expand(MBS, SEQ),
                   "attention_mask": torch.tril(torch.ones(SEQ, SEQ)).view(1, 1, SEQ, SEQ) < 0.5,
                   "loss_mask": torch.ones(MBS, SEQ)}

    def forward_step(data_iterator, model):
        batch = {key: value.cuda() for key, value in next(data_iterator).items()}
        output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"])

        def loss_func(output_tensor):
            loss = torch.sum(output_tensor.float().view(-1) * batch["loss_mask"].view(-1)) / batch["loss_mask"].sum()
            return loss, {"lm loss": loss}

        return output, loss_func

    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    forward_backward = get_forward_backward_func()
    data = batches()
    for step in range(20):
        optimizer.zero_grad()
        losses = forward_backward(forward_step_func=forward_step, data_iterator=data, model=model, num_microbatches=1,
                                  seq_length=SEQ, micro_batch_size=MBS, decoder_seq_length=SEQ, forward_only=False)
        optimizer.step()
        print(step, losses)


if __name__ == "__main__":
    main()
