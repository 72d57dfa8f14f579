"""On a CUDA GPU: the models compute there what they compute on the CPU, every task trains
compiled in bf16, and DDP runs over NCCL. Skipped without a GPU (CI has none); ``bash
scripts/test.sh`` runs them wherever PyTorch sees one."""

from __future__ import annotations

import pytest
import torch

from annotated_transformer import checkpoint, cli
from annotated_transformer.data import PAD, make_task
from annotated_transformer.model import DecoderOnlyTransformer, EncoderDecoder
from annotated_transformer.parts import Parts
from annotated_transformer.recipes import RECIPES

from train_tasks import TRAINED_TASKS, task_arguments

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU: torch.cuda.is_available() is False here"),
]


@pytest.fixture(autouse=True)
def exact_fp32_matmuls():
    """TF32 would round the GPU's products to 10 bits of mantissa: compare in true fp32."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("source", ["solutions", "fast"])
@pytest.mark.parametrize("name", ["dates", "addition"])
def test_the_model_on_cuda_computes_what_it_computes_on_the_cpu(source, name):
    """The same weights and batch (padding, both model kinds): logits and gradients agree."""
    task = make_task(name)
    torch.manual_seed(0)
    kind = DecoderOnlyTransformer if task.decoder_only else EncoderDecoder
    cpu = kind(RECIPES[name].model_config(task), parts=Parts(source)).eval()
    gpu = kind(RECIPES[name].model_config(task), parts=Parts(source)).cuda().eval()
    gpu.load_state_dict(cpu.state_dict())
    batch = cpu.teacher_forcing(*task.sample(16, torch.Generator().manual_seed(1)))
    outputs = []
    for model, device in ((cpu, "cpu"), (gpu, "cuda")):
        on = batch.to(torch.device(device))
        logits = model(*on.args)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), on.labels.flatten(),
                                                 ignore_index=PAD)
        loss.backward()
        grads = {n: p.grad.cpu() for n, p in model.named_parameters()}
        outputs.append((logits.detach().cpu(), loss.item(), grads))
    (cpu_logits, cpu_loss, cpu_grads), (gpu_logits, gpu_loss, gpu_grads) = outputs
    assert torch.allclose(cpu_logits, gpu_logits, atol=1e-4, rtol=1e-4), (
        f"logits differ by up to {(cpu_logits - gpu_logits).abs().max():.2e}")
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-5)
    for n, g in cpu_grads.items():
        assert torch.allclose(g, gpu_grads[n], atol=1e-4, rtol=1e-3), f"gradient of {n}"


@pytest.mark.slow
@pytest.mark.alone  # Inductor compiles with a process per core, within its timeout
@pytest.mark.timeout(900)
@pytest.mark.parametrize("task", TRAINED_TASKS)
def test_every_task_trains_compiled_in_bf16(capsys, tmp_path, task):
    """``train --precision bf16 --compile`` (Inductor, Triton kernels), a few steps."""
    status = cli.main(["train", *task_arguments(task, tmp_path), "--device", "cuda",
                       "--precision", "bf16", "--compile", "--steps", "4", "--batch-size", "32",
                       "--eval-size", "16", "--no-progress", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "cuda" in out and "bf16, compiled (inductor)" in out
    losses = torch.load(tmp_path / checkpoint.FILE_NAME, weights_only=True)["history"]["loss"]
    assert len(losses) == 4 and all(0 < loss < 100 for loss in losses), losses


@pytest.mark.skipif(not torch.distributed.is_available()
                    or not torch.distributed.is_nccl_available(),
                    reason="needs a CUDA GPU and PyTorch's NCCL backend")
def test_ddp_over_nccl_with_one_process_trains_as_without(tmp_path):
    """One process in an NCCL group: the model trains inside DistributedDataParallel, the
    losses are summed over the group, and the run equals one without the group."""
    import torch.distributed as dist

    from annotated_transformer import distributed
    from annotated_transformer.train import TrainConfig, train

    task = make_task("dates")
    config = TrainConfig(steps=4, batch_size=24, eval_every=4, eval_size=10, warmup_steps=2)
    histories = []
    for grouped in (False, True):
        if grouped:
            dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}",
                                    rank=0, world_size=1)
        try:
            assert distributed.is_distributed() == grouped
            torch.manual_seed(0)
            model = EncoderDecoder(RECIPES["dates"].model_config(task)).cuda()
            histories.append(train(model, task, config).loss)
        finally:
            distributed.teardown()
    plain, ddp = histories
    assert len(plain) == len(ddp) == 4
    assert torch.allclose(torch.tensor(plain), torch.tensor(ddp), rtol=1e-4, atol=1e-5), (
        plain, ddp)
