"""Whole scripts through every AMP rule: autocast around forward and loss only, one scaler wired everywhere."""

import ast
import textwrap

from migrate.engine import migrate_source
from rules import select_rules
from rules import AmpPolicy, Settings

AMP = select_rules(["AMP"])

GAN = textwrap.dedent(
    """
    import torch
    import torch.optim as optim

    optimizerD = optim.Adam(netD.parameters())
    optimizerG = optim.Adam(netG.parameters())
    for epoch in range(2):
        for real in loader:
            label = torch.full((4, 1), 1.0)
            netD.zero_grad()
            output = netD(real)
            errD_real = criterion(output, label)
            errD_real.backward()
            noise = torch.randn(4, 8)
            fake = netG(noise)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            optimizerD.step()
            netG.zero_grad()
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            optimizerG.step()
        torch.save({"G": netG.state_dict(), "optimizerG": optimizerG.state_dict()}, "gan.pt")
    """
)

SPLIT_TRAINER = textwrap.dedent(
    """
    import torch

    def train(model, loader, optimizer):
        for x, y in loader:
            x = x.to("cuda")
            out = model(x)
            loss = criterion(out, y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
            optimizer.step()

    def evaluate(model, loader):
        with torch.no_grad():
            for x, y in loader:
                print(criterion(model(x), y).item())

    def main():
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train(model, loader, optimizer)
        evaluate(model, loader)
    """
)


def port(source: str, **settings) -> str:
    result = migrate_source(source, "train.py", Settings(**settings), AMP)
    ast.parse(result.code)
    assert migrate_source(result.code, "train.py", Settings(**settings), AMP).code == result.code, "not idempotent"
    return result.code


def test_gan_gets_one_scaler_each_loss_scaled_each_optimizer_stepped_one_update():
    code = port(GAN)
    assert code.count("GradScaler(") == 1
    assert code.count("with torch.autocast(") == 3
    for loss in ("errD_real", "errD_fake", "errG"):
        assert f"scaler.scale({loss}).backward()" in code
    assert "scaler.step(optimizerD)" in code and "scaler.step(optimizerG)" in code
    assert code.count("scaler.update()") == 1
    assert code.index("scaler.step(optimizerG)") < code.index("scaler.update()")
    assert '"optimizerG": optimizerG.state_dict(),\n                "scaler": scaler.state_dict()}' in code


def test_autocast_holds_forward_and_loss_but_not_data_backward_or_step():
    code = port(GAN)
    blocks = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.With)]
    inside = {ast.unparse(statement) for block in blocks for statement in block.body}
    assert "errD_real = criterion(output, label)" in inside and "fake = netG(noise)" in inside
    assert not any("backward" in text or ".step(" in text or "torch.full" in text for text in inside)
    assert "netG.zero_grad()" not in inside and "label = torch.full((4, 1), 1.0)" not in inside


def test_values_collected_in_a_list_do_not_start_the_autocast_block():
    """pytorch/examples' actor-critic: the discounted returns, built with `returns.insert(0, R)`, came under autocast
    with everything after them (a list method counted as a model run)."""
    code = port(
        textwrap.dedent(
            """
            import torch

            def finish_episode(model, optimizer, rewards, gamma):
                returns = []
                R = 0
                for r in rewards[::-1]:
                    R = r + gamma * R
                    returns.insert(0, R)
                returns = torch.tensor(returns)
                loss = criterion(model(states), returns)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            """
        )
    )
    block = next(node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.With))
    assert [ast.unparse(statement) for statement in block.body] == ["loss = criterion(model(states), returns)"]


def test_scaler_reaches_a_loop_in_another_function_without_changing_signatures():
    code = port(SPLIT_TRAINER)
    tree = ast.parse(code)
    module_level = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Assign)]
    assert module_level == ["scaler = torch.amp.GradScaler('npu')"]
    assert "def train(model, loader, optimizer):" in code
    assert code.index("scaler.unscale_(optimizer)") < code.index("clip_grad_value_")
    assert "with torch.no_grad():\n        for x, y in loader:\n            print(" in code  # evaluation left alone


def test_bf16_autocasts_without_any_scaler():
    code = port(SPLIT_TRAINER, amp=AmpPolicy.BF16)
    assert "dtype=torch.bfloat16" in code and "scaler" not in code


def test_script_with_amp_keeps_its_one_scaler_and_gets_update_and_unscale():
    source = textwrap.dedent(
        """
        import torch
        scaler = torch.cuda.amp.GradScaler()
        for x, y in loader:
            with torch.cuda.amp.autocast():
                loss = criterion(model(x), y)
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
        """
    )
    code = port(source)
    assert code.count("GradScaler(") == 1 and code.count("autocast(") == 1
    assert code.index("scaler.unscale_(optimizer)") < code.index("clip_grad_norm_")
    assert code.index("scaler.step(optimizer)") < code.index("scaler.update()")


def test_off_changes_nothing():
    assert port(GAN, amp=AmpPolicy.OFF) == GAN


BCE_GAN = GAN.replace("import torch.optim as optim\n", "import torch.optim as optim\ncriterion = torch.nn.BCELoss()\n")


def test_a_bce_loss_runs_after_autocast_on_float32_inputs_while_the_forward_stays_under_it():
    code = port(BCE_GAN)
    blocks = [node for node in ast.walk(ast.parse(code)) if isinstance(node, ast.With)]
    inside = {ast.unparse(statement) for block in blocks for statement in block.body}
    assert len(blocks) == 3 and "fake = netG(noise)" in inside and "output = netD(fake.detach())" in inside
    assert not any("criterion(" in text for text in inside)  # binary_cross_entropy raises under autocast
    for loss in ("errD_real", "errD_fake", "errG"):
        assert f"{loss} = criterion(output.float(), label.float())\n" in code
        assert f"scaler.scale({loss}).backward()" in code


def test_a_bce_loss_computed_with_its_forward_is_reported_not_wrapped():
    source = textwrap.dedent(
        """
        import torch
        import torch.nn.functional as F

        def train(model, loader, optimizer):
            for x, y in loader:
                optimizer.zero_grad()
                loss = F.binary_cross_entropy(torch.sigmoid(model(x)), y)
                loss.backward()
                optimizer.step()
        """
    )
    result = migrate_source(source, "train.py", Settings(), AMP)
    assert result.code == source
    [finding] = [f for f in result.findings if f.code == "AMP105"]
    assert finding.line == 8 and "BCEWithLogitsLoss" in finding.suggestion


def test_a_module_level_scaler_follows_the_imports_and_constants_under_a_comment():
    source = SPLIT_TRAINER.replace("import torch\n", "import torch\n\nLR = 0.1\nEPOCHS, CLIP = 3, 0.5\n", 1)
    lines = port(source).splitlines()
    at = lines.index('scaler = torch.amp.GradScaler("npu")')
    assert lines[at - 3 : at] == ["EPOCHS, CLIP = 3, 0.5", "", lines[at - 1]]
    assert lines[at - 1].startswith("# AMP101 mixed precision: one loss scaler")


def test_a_scaler_next_to_the_optimizer_comes_without_a_comment():
    code = port(GAN)
    assert 'optimizerG = optim.Adam(netG.parameters())\nscaler = torch.amp.GradScaler("npu")\n' in code


def test_resume_loads_the_scaler_after_the_optimizer_when_the_checkpoint_has_it():
    source = SPLIT_TRAINER.replace(
        "    train(model, loader, optimizer)\n",
        "    if resume:\n"
        "        ckpt = torch.load(resume)\n"
        "        model.load_state_dict(ckpt['model'])\n"
        "        optimizer.load_state_dict(ckpt['optim'])\n"
        "    train(model, loader, optimizer)\n"
        "    torch.save({'model': model.state_dict(), 'optim': optimizer.state_dict()}, 'ckpt.pt')\n",
    ).replace("def main():", "def main(resume):")
    code = port(source)
    assert (
        "        optimizer.load_state_dict(ckpt['optim'])\n"
        "        if 'scaler' in ckpt:  # older checkpoints have no scaler state\n"
        "            scaler.load_state_dict(ckpt['scaler'])\n"
    ) in code
    assert "'optim': optimizer.state_dict(),\n                'scaler': scaler.state_dict()}" in code


def test_resume_is_left_alone_where_the_scaler_does_not_reach():
    source = textwrap.dedent(
        """
        import torch

        def resume(optimizer, path):
            checkpoint = torch.load(path)
            optimizer.load_state_dict(checkpoint["optimizer"])

        def main():
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            torch.save({"optimizer": optimizer.state_dict()}, "ckpt.pt")
        """
    )
    code = port(source)
    assert '"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()' in code
    assert "scaler.load_state_dict" not in code  # the scaler lives in main(); resume() cannot see it


def test_a_step_with_a_hand_written_alternative_update_is_reported_not_scaled():
    """Regression (pytorch/examples word_language_model): `if use_optimizer: optimizer.step() else: p.data.add_(...)`
    got an unconditional scaler.scale(loss).backward(), so the hand-written update applied scaled gradients."""
    source = textwrap.dedent(
        """
        import torch

        def train(model, data, targets, optimizer, criterion, args):
            for i in range(10):
                model.zero_grad()
                output = model(data)
                loss = criterion(output, targets)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
                if args.use_optimizer:
                    optimizer.step()
                else:
                    for p in model.parameters():
                        p.data.add_(p.grad, alpha=-args.lr)
        """
    )
    result = migrate_source(source, "train.py", Settings())
    assert "scaler" not in result.code and "GradScaler" not in result.code
    reported = [f for f in result.findings if f.code == "AMP105"]
    assert [f.line for f in reported] == [12] and "other branch" in reported[0].message


NEVER_CLEARED = textwrap.dedent(
    """
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=0.25)
    for i in range(10):
        output = model(torch.rand(20, 10))
        output.sum().backward()
        optimizer.step()
    """
)


def test_a_loop_that_never_clears_its_gradients_gets_no_loss_scaler_but_bf16_autocast():
    """Regression (pytorch/examples' tensor-parallel toys): a GradScaler on gradients summed over steps at other
    scales overflowed once and skipped every later update."""
    fp16 = migrate_source(NEVER_CLEARED, "train.py", Settings(), AMP)
    assert fp16.code == NEVER_CLEARED
    [finding] = [f for f in fp16.findings if f.code == "AMP105"]
    assert finding.line == 5 and "never clears its gradients" in finding.message
    bf16 = port(NEVER_CLEARED, amp=AmpPolicy.BF16)
    assert "torch.autocast(device_type=\"npu\", dtype=torch.bfloat16)" in bf16 and "GradScaler" not in bf16


def test_with_unsafe_fixes_the_loop_is_cleared_and_scaled_in_one_run():
    """TRN001's fix clears the gradients, so the loop gets its scaler in the same run: a second run changes
    nothing."""
    code = migrate_source(NEVER_CLEARED, "train.py", Settings(unsafe_fixes=True)).code
    assert "    optimizer.zero_grad()\n" in code and "scaler.step(optimizer)" in code
    assert migrate_source(code, "train.py", Settings(unsafe_fixes=True)).code == code
