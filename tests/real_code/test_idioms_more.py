"""More correct training idioms from well-known public code stay silent under `watch()`.

The companion of test_idioms_real.py, in its style: each idiom is written in the shape of the code
named in its test's docstring (tiny models, 2-5 iterations, CPU, random weights). "Silent" means no
finding of severity error or warning (info is allowed), no exception, and parameters, buffers and
gradients bit-identical to the same code run without watch() from the same seeds (`twin`); here the
losses (and whatever else the loop records) are compared too.

Where an idiom has a genuinely hazardous variant, it is here too: its behaviour in plain PyTorch
is checked first (it raises, or it silently changes gradients), then the finding the tool must
make and the lines it must name.

SAM, CleanRL's PPO and the Lookahead wrappers live in tests/real_code/idioms_more/*.py and also run
as scripts under `inplace-doctor run`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_idioms import (
    has_error,
    load_program,
    one_thread,  # noqa: F401  (its autouse fixture, for these tests too)
    serious,
    twin,
)
from torch import nn

import inplace_doctor as ipd
from inplace_doctor import Severity

HERE = Path(__file__).resolve()
IDIOMS = HERE.parent / "idioms_more"
REPO = HERE.parents[2]


def load(name: str) -> ModuleType:
    """Import tests/real_code/idioms_more/<name>.py (plain files, no package)."""
    return load_program(IDIOMS, name)


def describe(findings) -> str:
    return "\n\n".join(f"{f.code} {f.severity} (mutation {f.mutation.file}:{f.mutation.line}): {f.message}" for f in findings)


def marker(path: Path, name: str) -> int:
    """The one line of `path` ending with the comment `# <name>`."""
    hits = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith(f"# <{name}>")]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def same(a, b) -> bool:
    """Recorded values (tensors, floats, nested lists/tuples) bit-identical."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def twin_recorded(build, train, modules, key: str = "losses", **kw):
    """`twin`, and the values the loop recorded under objs[key] bit-identical in both runs."""
    session, plain, watched = twin(build, train, modules, **kw)
    assert plain[key], "the loop recorded nothing"
    assert same(plain[key], watched[key]), f"{key} differ from the run without watch()"
    return session, plain, watched


# ---------------------------------------------------------------------------
# 1. SAM (davda54/sam)
# ---------------------------------------------------------------------------

SAM_FILE = IDIOMS / "sam.py"


@pytest.mark.parametrize("form", ["sam", "sam_old_p", "asam_old_p", "sam_closure"])
def test_sam_two_pass_step_is_clean(form):
    """Modelled on davda54/sam: sam.py (HEAD: `first_step` does `p.add_(e_w)` under no_grad,
    `second_step` does `p.sub_(e_w)` then the base SGD step; the 2021 ASAM version keeps
    `old_p = p.data.clone()` and restores with `p.data = old_p`; the README's closure form
    `optimizer.step(closure)`), driven by example/train.py (`enable_running_stats` / first
    forward-backward / `first_step(zero_grad=True)` / `disable_running_stats` / second
    forward-backward / `second_step(zero_grad=True)`) on example/model/wide_res_net.py's
    WideResNet (BatchNorm -> ReLU(inplace=True) -> Conv, Dropout(0.0, inplace=True)) with
    smooth_crossentropy's `one_hot.scatter_`. The perturbation is written between two complete
    forward-backward passes: backward never reads an overwritten weight."""
    sam = load("sam")
    twin_recorded(lambda: sam.build(form), sam.train, sam.modules)


def _sam_restore_too_early(form: str):
    sam = load("sam")
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        sam.train_restoring_before_backward(sam.build(form))
    torch.manual_seed(0)
    objs = sam.build(form)
    with pytest.raises(ipd.InplaceError), ipd.watch(objs["model"]) as session:
        sam.train_restoring_before_backward(objs)
    assert has_error(session.findings, "IPD101"), describe(session.findings)
    return [f for f in serious(session.findings) if f.code == "IPD101"]


def test_sam_restoring_the_weights_before_the_second_backward_is_flagged():
    """Hazard: `second_step()` (which restores `w` with `p.sub_(e_w)`, then runs the base SGD step)
    called between the second forward, at `w + e(w)`, and its backward. The WideResNet's layers
    saved the perturbed weights; plain PyTorch raises "modified by an inplace operation" (checked
    here): IPD101, the write in sam.py's `second_step`, the saver in the WideResNet's forward."""
    hits = _sam_restore_too_early("sam")
    assert any(Path(f.mutation.file or "") == SAM_FILE and f.saved is not None and Path(f.saved.file or "") == SAM_FILE
               for f in hits), describe(hits)


def test_sam_restoring_the_weights_before_the_second_backward_names_the_restoring_write():
    """The same hazard: the write that first made the saved weights stale (version 2 -> 3) is the
    `p.sub_(e_w)` line; the finding must name it (moving the SGD step alone does not fix the program)."""
    hits = _sam_restore_too_early("sam")
    assert any(Path(f.mutation.file or "") == SAM_FILE and f.mutation.line == marker(SAM_FILE, "sam-sub")
               for f in hits), describe(hits)


@pytest.mark.xfail(strict=True, reason=(
    "after `p.data = old_p` (SAM 2021's restore) the parameter's next in-place write (the base SGD "
    "step in second_step) is not linked to the tensor the forward saved (`w.t()` of the old storage, "
    "which shares the parameter's version counter): the IPD101 finding says `<unknown write>` at "
    "<unknown location> during backward, 'The write happened outside the instrumented code', "
    "instead of naming sam.py's `self.base_optimizer.step()` line"))
def test_sam_old_p_restoring_before_the_second_backward_names_the_base_step():
    """Hazard: the same misplaced `second_step()` with the 2021 SAM: `p.data = old_p` swaps the
    parameter's storage (no version bump), then the base SGD step's in-place update bumps the
    version counter the saved `w.t()` still shares, and backward raises (checked). IPD101 should
    name the line that wrote: the base optimizer's step in `second_step`."""
    hits = _sam_restore_too_early("sam_old_p")
    step_line = marker(SAM_FILE, "sam-old-p-base-step")
    assert any(Path(f.mutation.file or "") == SAM_FILE and f.mutation.line == step_line for f in hits), describe(hits)


def test_sam_wide_resnet_with_dropout_after_inplace_relu_is_flagged():
    """Hazard in the public code itself: example/model/wide_res_net.py puts
    `nn.Dropout(dropout, inplace=True)` right after `nn.ReLU(inplace=True)`. With the default
    `--dropout 0.0` that is harmless, with any dropout > 0 the in-place dropout overwrites the ReLU
    output ReluBackward0 saved, and plain PyTorch raises (checked): IPD101 on the dropout modules,
    the ReLU as the saver, the fix turning the dropout's `inplace` off."""
    sam = load("sam")
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        sam.train(sam.build("sam", dropout=0.1), steps=1)
    torch.manual_seed(0)
    objs = sam.build("sam", dropout=0.1)
    with pytest.raises(ipd.InplaceError), ipd.watch(objs["model"]) as session:
        sam.train(objs, steps=1)
    hits = [f for f in session.findings if f.code == "IPD101" and f.severity is Severity.ERROR]
    assert hits, describe(session.findings)
    f = hits[0]
    assert f.mutation.module.endswith("_dropout") and f.mutation.module_type == "Dropout", describe(hits)
    assert f.saved.module.endswith("_activation") and f.saved.module_type == "ReLU", describe(hits)
    assert "inplace = False" in f.fix or "inplace=False" in f.fix, f.fix


@pytest.mark.xfail(strict=True, reason=(
    "the `inplace=True` module's construction site (Site.origin) is not found for a module built "
    "inside an `nn.Sequential(OrderedDict([...]))` literal: origin is None and the fix says only "
    "'set `model.f.3_block.block.1.block.5_dropout.inplace = False` (or construct it with "
    "inplace=False)' where for `self.drop = nn.Dropout(...)` it names the constructing line"))
def test_sam_wide_resnet_dropout_finding_names_where_the_dropout_was_constructed():
    """The same finding: README promises that "the fix names the line that constructed the module
    with inplace=True"; here that is wide_res_net.py's `("5_dropout", nn.Dropout(dropout,
    inplace=True))` line."""
    sam = load("sam")
    torch.manual_seed(0)
    objs = sam.build("sam", dropout=0.1)
    with pytest.raises(ipd.InplaceError), ipd.watch(objs["model"]) as session:
        sam.train(objs, steps=1)
    hits = [f for f in session.findings if f.code == "IPD101" and f.severity is Severity.ERROR]
    assert hits, describe(session.findings)
    origin = hits[0].mutation.origin
    assert origin is not None and f"sam.py:{marker(SAM_FILE, 'wrn-dropout')}" in str(origin), (origin, hits[0].fix)


# ---------------------------------------------------------------------------
# 2. CleanRL PPO
# ---------------------------------------------------------------------------


def test_cleanrl_ppo_rollout_buffers_and_minibatch_epochs_are_clean():
    """Modelled on vwxyzjn/cleanrl cleanrl/ppo.py: rollout storage written in place step by step
    (`obs[step] = next_obs`, `values[step] = value.flatten()` under no_grad, `actions[step] =
    action`, `rewards[step] = torch.tensor(reward).view(-1)`), GAE into `advantages[t] = lastgaelam
    = ...`, then `update_epochs` epochs over shuffled minibatches of the flattened views: clipped
    surrogate, normalised advantages, clipped value loss, entropy bonus, `clip_grad_norm_`, Adam with
    the annealed lr; the second rollout overwrites the buffers the first update's views alias. The
    losses, approx-KL, clip fractions and final buffers are compared with the plain run too."""
    ppo = load("ppo_cleanrl")
    _, plain, watched = twin_recorded(ppo.build, ppo.train, ppo.modules)
    assert same(plain["buffers"], watched["buffers"])


# ---------------------------------------------------------------------------
# 3. WGAN-GP gradient penalty (double backward)
# ---------------------------------------------------------------------------

IMG_SHAPE, LATENT = (1, 8, 8), 6


class GPGenerator(nn.Module):
    """eriklindernoren/PyTorch-GAN implementations/wgan_gp/wgan_gp.py Generator (widths / 8)."""

    def __init__(self):
        super().__init__()

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(LATENT, 16, normalize=False),
            *block(16, 32),
            *block(32, 64),
            nn.Linear(64, int(np.prod(IMG_SHAPE))),
            nn.Tanh(),
        )

    def forward(self, z):
        img = self.model(z)
        img = img.view(img.size(0), *IMG_SHAPE)
        return img


class GPDiscriminator(nn.Module):
    """wgan_gp.py Discriminator (no normalisation, as WGAN-GP requires), or ("conv") the DCGAN-style
    critic of the forks that train WGAN-GP on images (Conv -> LeakyReLU(0.2, inplace=True))."""

    def __init__(self, kind: str = "mlp"):
        super().__init__()
        if kind == "mlp":
            self.model = nn.Sequential(
                nn.Flatten(),
                nn.Linear(int(np.prod(IMG_SHAPE)), 32),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Linear(32, 16),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Linear(16, 1),
            )
        else:
            self.model = nn.Sequential(
                nn.Conv2d(1, 4, 4, 2, 1, bias=False),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(4, 8, 4, 2, 1, bias=False),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Conv2d(8, 1, 2, 1, 0, bias=False),
                nn.Flatten(),
            )

    def forward(self, img):
        return self.model(img)


def compute_gradient_penalty(D, real_samples, fake_samples, rng):
    """wgan_gp.py compute_gradient_penalty (`Tensor(np.random.random(...))` is `torch.tensor` of rng)."""
    alpha = torch.tensor(rng.random((real_samples.size(0), 1, 1, 1)), dtype=torch.float32)
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = torch.empty(real_samples.shape[0], 1).fill_(1.0).requires_grad_(False)
    gradients = torch.autograd.grad(
        outputs=d_interpolates,
        inputs=interpolates,
        grad_outputs=fake,
        create_graph=True,
        retain_graph=True,
        only_inputs=True,
    )[0]
    gradients = gradients.view(gradients.size(0), -1)
    gradient_penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
    return gradient_penalty


@pytest.mark.parametrize("critic", ["mlp", "conv"])
def test_wgan_gp_gradient_penalty_with_create_graph_is_clean(critic):
    """Modelled on eriklindernoren/PyTorch-GAN implementations/wgan_gp/wgan_gp.py: per batch
    `optimizer_D.zero_grad()`, fake from G *with* grad, `real_validity`/`fake_validity`, the
    gradient penalty on `(alpha*real.data + (1-alpha)*fake.data).requires_grad_(True)` through
    `autograd.grad(..., create_graph=True, retain_graph=True)` (double backward through the
    critic's in-place LeakyReLUs), `d_loss.backward()` (which also reaches G), `optimizer_D.step()`,
    `optimizer_G.zero_grad()`, and every `n_critic` batches a fresh `generator(z)` for the G step."""
    lambda_gp, n_critic = 10, 2

    def build():
        generator, discriminator = GPGenerator(), GPDiscriminator(critic)
        return {
            "G": generator, "D": discriminator,
            "opt_G": torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999)),
            "opt_D": torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999)),
            "rng": np.random.default_rng(0), "losses": [],
        }

    def train(objs):
        generator, discriminator, optimizer_G, optimizer_D = objs["G"], objs["D"], objs["opt_G"], objs["opt_D"]
        rng = objs["rng"]
        for i in range(4):
            real_imgs = torch.rand(6, *IMG_SHAPE) * 2 - 1
            optimizer_D.zero_grad()
            z = torch.tensor(rng.normal(0, 1, (real_imgs.shape[0], LATENT)), dtype=torch.float32)
            fake_imgs = generator(z)
            real_validity = discriminator(real_imgs)
            fake_validity = discriminator(fake_imgs)
            gradient_penalty = compute_gradient_penalty(discriminator, real_imgs.data, fake_imgs.data, rng)
            d_loss = -torch.mean(real_validity) + torch.mean(fake_validity) + lambda_gp * gradient_penalty
            d_loss.backward()
            optimizer_D.step()
            optimizer_G.zero_grad()
            objs["losses"].append(d_loss.detach())
            if i % n_critic == 0:
                fake_imgs = generator(z)
                fake_validity = discriminator(fake_imgs)
                g_loss = -torch.mean(fake_validity)
                g_loss.backward()
                optimizer_G.step()
                objs["losses"].append(g_loss.detach())
        return objs["losses"]

    twin_recorded(build, train, lambda o: (o["G"], o["D"]))


# ---------------------------------------------------------------------------
# 4. timm Mixup / CutMix in place on the batch; DropPath
# ---------------------------------------------------------------------------


def drop_path_dino(x, drop_prob: float = 0.0, training: bool = False):
    """facebookresearch/dino vision_transformer.py drop_path (the timm <= 0.4 form)."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # work with diff dim tensors, not just 2D ConvNets
    random_tensor = keep_prob + torch.rand(shape, dtype=x.dtype, device=x.device)
    random_tensor.floor_()  # binarize
    output = x.div(keep_prob) * random_tensor
    return output


class DropPathDino(nn.Module):
    def __init__(self, drop_prob=None):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path_dino(x, self.drop_prob, self.training)


class ConvNeXtishBlock(nn.Module):
    """A residual block with stochastic depth on its branch, as timm's ConvNeXt/ResNet blocks use
    it (`x = shortcut + self.drop_path(x)`), with DINO's or timm's DropPath."""

    def __init__(self, dim: int, drop_path, drop: float):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.norm = nn.BatchNorm2d(dim)
        self.pwconv = nn.Conv2d(dim, dim, 1)
        self.act = nn.ReLU(inplace=True)
        self.drop_path = drop_path(drop)

    def forward(self, x):
        shortcut = x
        x = self.pwconv(self.act(self.norm(self.dwconv(x))))
        x = shortcut + self.drop_path(x)
        return x


def _drop_path_net(which: str) -> nn.Module:
    from timm.layers import DropPath

    dp = DropPathDino if which == "dino" else DropPath
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), ConvNeXtishBlock(8, dp, 0.3), ConvNeXtishBlock(8, dp, 0.5),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


MIXUPS = {
    "batch_mixup": dict(mixup_alpha=0.8, cutmix_alpha=0.0, mode="batch"),
    "batch_cutmix": dict(mixup_alpha=0.0, cutmix_alpha=1.0, mode="batch"),
    "batch_switch": dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mode="batch"),
    "pair": dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mode="pair"),
    "elem": dict(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mode="elem"),
}


@pytest.mark.parametrize("net", ["dino_drop_path", "timm_drop_path", "timm_vit"])
@pytest.mark.parametrize("mix", list(MIXUPS))
def test_timm_mixup_cutmix_in_place_on_the_batch_with_drop_path_is_clean(mix, net):
    """Modelled on timm train.py `train_one_epoch` (`input, target = mixup_fn(input, target)`,
    then `output = model(input)`, `loss = loss_fn(output, target)` with SoftTargetCrossEntropy,
    `optimizer.zero_grad()`, backward, `clip_grad_norm_`, step) with the real timm.data.Mixup: batch
    mode writes the batch in place (`x.flip(0).mul_(1-lam)`, `x.mul_(lam).add_(x_flipped)`, or
    CutMix's `x[:, :, yl:yh, xl:xh] = x.flip(0)[...]`), pair/elem modes write `x[i] = ...` rows
    from a clone. The model's stochastic depth is DINO's `drop_path` (`random_tensor.floor_()`,
    `x.div(keep_prob) * random_tensor`), timm's DropPath (`x.new_empty(shape).bernoulli_(keep)`,
    `random_tensor.div_(keep_prob)`), or a real timm ViT with drop_path_rate=0.2."""
    pytest.importorskip("timm")
    import timm
    from timm.data import Mixup
    from timm.loss import SoftTargetCrossEntropy

    def build():
        if net == "timm_vit":
            model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=8, patch_size=4, embed_dim=16,
                                      depth=2, num_heads=2, num_classes=5, drop_path_rate=0.2)
        else:
            model = _drop_path_net("dino" if net == "dino_drop_path" else "timm")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        mixup_fn = Mixup(label_smoothing=0.1, num_classes=5, **MIXUPS[mix])
        return {"model": model, "optimizer": optimizer, "mixup_fn": mixup_fn, "losses": []}

    def train(objs):
        model, optimizer, mixup_fn = objs["model"], objs["optimizer"], objs["mixup_fn"]
        loss_fn = SoftTargetCrossEntropy()
        np.random.seed(0)  # Mixup draws lam and the boxes from NumPy's global generator
        model.train()
        for _ in range(3):
            input, target = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
            input, target = mixup_fn(input, target)
            output = model(input)
            loss = loss_fn(output, target)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            objs["losses"].extend([loss.detach(), input.clone(), target.clone()])
        return objs["losses"]

    twin_recorded(build, train, lambda o: (o["model"],))


# ---------------------------------------------------------------------------
# 5. torch.func per-sample gradients; GradScaler recipes of the AMP docs
# ---------------------------------------------------------------------------


class SimpleCNN(nn.Module):
    """The PyTorch per-sample-gradients tutorial's SimpleCNN (intermediate/per_sample_grads.py),
    shrunk; `inplace` switches its ReLUs to the in-place form torchvision models use."""

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.fc1 = nn.Linear(8 * 2 * 2, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x, inplace=self.inplace)
        x = self.conv2(x)
        x = F.relu(x, inplace=self.inplace)
        x = F.max_pool2d(x, 2)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x, inplace=self.inplace)
        x = self.fc2(x)
        return x


FUNC_REASON = (
    "watch() installs torch.autograd.graph.saved_tensors_hooks, and torch.func.grad / vjp / jacrev / "
    "hessian refuse to run under them: the correct program, which runs without the tool, raises "
    "RuntimeError \"torch.func.{grad, vjp, jacrev, hessian} don't yet support saved tensor hooks. "
    "Please open an issue with your use case.\" inside watch() (and under `inplace-doctor run`, "
    "blamed on the script)"
)


@pytest.mark.parametrize("inplace", [False, True])
def test_torch_func_per_sample_gradients_dp_sgd_step_is_clean(inplace):
    """Modelled on the PyTorch tutorial "Per-sample-gradients" (intermediate_source/per_sample_grads.py):
    `params = {k: v.detach() for k, v in model.named_parameters()}`, `compute_loss` through
    `functional_call(model, (params, buffers), (batch,))`, `vmap(grad(compute_loss), in_dims=(None,
    None, 0, 0))`, checked against the loop of per-sample `loss.backward()` the tutorial compares
    with; then a DP-SGD step on them as Opacus does it (per-sample clipping to max_grad_norm,
    Gaussian noise, `p.grad = ...`, SGD step)."""
    from torch.func import functional_call, grad, vmap

    def build():
        model = SimpleCNN(inplace)
        return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1), "losses": []}

    def train(objs):
        model, optimizer = objs["model"], objs["optimizer"]
        max_grad_norm, noise_multiplier = 1.0, 0.5
        for _ in range(2):
            data, targets = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))

            def compute_grad(sample, target):  # the tutorial's loop reference
                prediction = model(sample.unsqueeze(0))
                loss = F.cross_entropy(prediction, target.unsqueeze(0))
                return torch.autograd.grad(loss, list(model.parameters()))

            per_sample_grads = [compute_grad(data[i], targets[i]) for i in range(data.shape[0])]
            per_sample_grads = [torch.stack(shards) for shards in zip(*per_sample_grads)]

            params = {k: v.detach() for k, v in model.named_parameters()}
            buffers = {k: v.detach() for k, v in model.named_buffers()}

            def compute_loss(params, buffers, sample, target):
                batch = sample.unsqueeze(0)
                targets = target.unsqueeze(0)
                predictions = functional_call(model, (params, buffers), (batch,))
                loss = F.cross_entropy(predictions, targets)
                return loss

            ft_compute_grad = grad(compute_loss)
            ft_compute_sample_grad = vmap(ft_compute_grad, in_dims=(None, None, 0, 0))
            ft_per_sample_grads = ft_compute_sample_grad(params, buffers, data, targets)
            for per_sample_grad, ft_per_sample_grad in zip(per_sample_grads, ft_per_sample_grads.values()):
                assert torch.allclose(per_sample_grad, ft_per_sample_grad, atol=3e-3, rtol=1e-5)

            # DP-SGD: clip each sample's gradient, sum, add noise, average
            flat = torch.cat([g.reshape(g.shape[0], -1) for g in ft_per_sample_grads.values()], dim=1)
            per_sample_norms = flat.norm(2, dim=1)
            clip_factor = (max_grad_norm / (per_sample_norms + 1e-6)).clamp(max=1.0)
            for name, p in model.named_parameters():
                g = torch.einsum("i,i...->...", clip_factor, ft_per_sample_grads[name])
                g = g + torch.normal(0.0, noise_multiplier * max_grad_norm, size=g.shape)
                p.grad = g / data.shape[0]
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            objs["losses"].extend([flat.clone(), per_sample_norms.clone()])
        return objs["losses"]

    twin_recorded(build, train, lambda o: (o["model"],))


def _tutorial_predict(weight, bias, x):
    """The torch.func "Jacobians, Hessians, hvp, vhp, and more" tutorial's `predict`."""
    return F.linear(x, weight, bias).tanh()


FUNC_TRANSFORMS = {
    "vmap": lambda w, b, x: torch.func.vmap(_tutorial_predict, in_dims=(None, None, 0))(w, b, x),
    "jacfwd": lambda w, b, x: torch.func.vmap(torch.func.jacfwd(_tutorial_predict, argnums=2), in_dims=(None, None, 0))(w, b, x),
    "jvp": lambda w, b, x: torch.func.jvp(lambda x: _tutorial_predict(w, b, x), (x,), (torch.ones_like(x),))[1],
    "jacrev": lambda w, b, x: torch.func.vmap(torch.func.jacrev(_tutorial_predict, argnums=2), in_dims=(None, None, 0))(w, b, x),
    "vjp": lambda w, b, x: torch.func.vjp(lambda x: _tutorial_predict(w, b, x), x)[1](torch.ones(x.shape[0], w.shape[0]))[0],
    "hessian": lambda w, b, x: torch.func.hessian(lambda x: _tutorial_predict(w, b, x).sum(), argnums=0)(x[0]),
}


@pytest.mark.parametrize("transform", [
    "vmap", "jacfwd", "jvp",
    "jacrev", "vjp", "hessian",
])
def test_torch_func_transforms_of_the_jacobians_tutorial_then_a_training_step_are_clean(transform):
    """Modelled on the torch.func tutorial "Jacobians, Hessians, hvp, vhp, and more"
    (intermediate_source/jacobians_hessians.py): `predict(weight, bias, x)` and its batched
    Jacobian `vmap(jacrev(predict, argnums=2), in_dims=(None, None, 0))` (or jacfwd), `jvp`, `vjp`,
    `hessian`, on a model's live parameters; the Jacobian's norm is then used as a regulariser of an
    ordinary training step of that model (its parameters stepped by Adam)."""

    def build():
        model = nn.Linear(3, 4)
        return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-2), "losses": []}

    def train(objs):
        model, optimizer = objs["model"], objs["optimizer"]
        for _ in range(2):
            x = torch.randn(5, 3)
            out = FUNC_TRANSFORMS[transform](model.weight, model.bias, x)
            loss = _tutorial_predict(model.weight, model.bias, x).square().mean() + 1e-2 * out.square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            objs["losses"].extend([out.detach().clone(), loss.detach()])
        return objs["losses"]

    twin_recorded(build, train, lambda o: (o["model"],))


def _amp_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )


@pytest.mark.parametrize("recipe", ["clipping", "accumulation", "gradient_penalty", "multiple_models"])
def test_grad_scaler_cpu_autocast_recipes_of_the_amp_docs_are_clean(recipe):
    """Modelled on the PyTorch "Automatic Mixed Precision examples" page (docs/source/notes/amp_examples.rst)
    on CPU with `torch.amp.GradScaler("cpu")` and `torch.autocast("cpu", dtype=torch.bfloat16)`:
    "Gradient clipping" (`scaler.scale(loss).backward()`, `scaler.unscale_(optimizer)`,
    `clip_grad_norm_`, `scaler.step`, `scaler.update`), "Gradient accumulation" (loss divided by
    iters_to_accumulate, step every 2 micro-batches), "Gradient penalty" (`autograd.grad(
    scaler.scale(loss), model.parameters(), create_graph=True)`, unscaled by `1/get_scale()`, the
    norm added to the loss under autocast, then `scaler.scale(loss).backward()`), and "Working with
    multiple models, losses, and optimizers" (two models, `backward(retain_graph=True)` of the
    first scaled loss, `unscale_` of one optimizer, `scaler.step` of both, one `update`). The
    scale is set to 2**4 so that the first steps are not skipped."""

    def build():
        m0, m1 = _amp_net(), _amp_net()
        return {
            "models": (m0, m1),
            "opts": (torch.optim.SGD(m0.parameters(), lr=0.05, momentum=0.9), torch.optim.Adam(m1.parameters(), lr=1e-3)),
            "scaler": torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=2),
            "losses": [],
        }

    def train(objs):
        (model, model1), (optimizer, optimizer1), scaler = objs["models"], objs["opts"], objs["scaler"]
        loss_fn = nn.CrossEntropyLoss()
        iters_to_accumulate = 2
        for i in range(4):
            input, target = torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
            if recipe != "accumulation":
                optimizer.zero_grad()
                optimizer1.zero_grad()
            if recipe == "clipping":
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    output = model(input)
                    loss = loss_fn(output, target)
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            elif recipe == "accumulation":
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    output = model(input)
                    loss = loss_fn(output, target)
                    loss = loss / iters_to_accumulate
                scaler.scale(loss).backward()
                if (i + 1) % iters_to_accumulate == 0:
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad()
            elif recipe == "gradient_penalty":
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    output = model(input)
                    loss = loss_fn(output, target)
                scaled_grad_params = torch.autograd.grad(outputs=scaler.scale(loss), inputs=model.parameters(), create_graph=True)
                inv_scale = 1.0 / scaler.get_scale()
                grad_params = [p * inv_scale for p in scaled_grad_params]
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    grad_norm = 0
                    for grad in grad_params:
                        grad_norm += grad.pow(2).sum()
                    grad_norm = grad_norm.sqrt()
                    loss = loss + grad_norm
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    output0 = model(input)
                    output1 = model1(input)
                    loss0 = loss_fn(2 * output0 + 3 * output1, target)
                    loss1 = loss_fn(3 * output0 - 5 * output1, target)
                scaler.scale(loss0).backward(retain_graph=True)
                scaler.scale(loss1).backward()
                scaler.unscale_(optimizer0 := optimizer)
                scaler.step(optimizer0)
                scaler.step(optimizer1)
                scaler.update()
                loss = loss0 + loss1
            objs["losses"].extend([loss.detach().float(), torch.tensor(scaler.get_scale())])
        return objs["losses"]

    twin_recorded(build, train, lambda o: o["models"])


# ---------------------------------------------------------------------------
# 6. VAE reparameterisation; orthogonal / weight_norm / custom parametrizations
# ---------------------------------------------------------------------------


class VAE(nn.Module):
    """pytorch/examples vae/main.py VAE (784-400-20 shrunk to 16-12-4), with the reparameterisation
    as written now ("randn_like": `std = torch.exp(0.5*logvar)`, `eps = torch.randn_like(std)`,
    `mu + eps*std`), as written in 2017 ("2017": `std = logvar.mul(0.5).exp_()`,
    `eps = Variable(std.data.new(std.size()).normal_())`, `eps.mul(std).add_(mu)`), and the fully
    in-place form many VAE repos use ("inplace": `eps = torch.randn_like(std)`,
    `eps.mul_(std).add_(mu)`)."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.fc1 = nn.Linear(16, 12)
        self.fc21 = nn.Linear(12, 4)
        self.fc22 = nn.Linear(12, 4)
        self.fc3 = nn.Linear(4, 12)
        self.fc4 = nn.Linear(12, 16)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        if self.form == "randn_like":
            std = torch.exp(0.5 * logvar)
            eps = torch.randn_like(std)
            return mu + eps * std
        if self.form == "2017":
            if self.training:
                std = logvar.mul(0.5).exp_()
                eps = std.data.new(std.size()).normal_()
                return eps.mul(std).add_(mu)
            return mu
        std = logvar.mul(0.5).exp_()
        eps = torch.randn_like(std)
        return eps.mul_(std).add_(mu)

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 16))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def vae_loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 16), reduction="sum")
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


@pytest.mark.parametrize("form", ["randn_like", "2017", "inplace"])
def test_vae_reparameterisation_train_and_sample_is_clean(form):
    """Modelled on pytorch/examples vae/main.py: `train` (zero_grad, `recon_batch, mu, logvar =
    model(data)`, BCE(sum) + KLD, backward, `train_loss += loss.item()`, Adam step), `test` under
    no_grad in eval mode, and the epoch's `sample = model.decode(torch.randn(64, 20))`."""

    def build():
        model = VAE(form)
        return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3), "losses": []}

    def train(objs):
        model, optimizer = objs["model"], objs["optimizer"]
        for epoch in range(2):  # noqa: B007 (the program as its authors wrote it)
            model.train()
            train_loss = 0
            for _ in range(2):
                data = torch.rand(4, 1, 4, 4)
                optimizer.zero_grad()
                recon_batch, mu, logvar = model(data)
                loss = vae_loss_function(recon_batch, data, mu, logvar)
                loss.backward()
                train_loss += loss.item()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                data = torch.rand(4, 1, 4, 4)
                recon_batch, mu, logvar = model(data)
                test_loss = vae_loss_function(recon_batch, data, mu, logvar).item()
                sample = model.decode(torch.randn(8, 4))
            objs["losses"].extend([train_loss, test_loss, sample.clone()])
        return objs["losses"]

    twin_recorded(build, train, lambda o: (o["model"],))


class Symmetric(nn.Module):
    """The parametrizations tutorial's `Symmetric` (intermediate_source/parametrizations.py)."""

    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)

    def right_inverse(self, A):
        return A.triu()


class OrthoRNN(nn.Module):
    """An RNN whose recurrent kernel is kept orthogonal (`parametrizations.orthogonal`, as the
    parametrizations tutorial's and expRNN's), its input map under `parametrizations.weight_norm`,
    a symmetric readout, unrolled with the tutorial's `with parametrize.cached():` so each
    parametrization is computed once per forward."""

    def __init__(self, orthogonal_map: str):
        super().__init__()
        P = nn.utils.parametrizations
        self.inp = P.weight_norm(nn.Linear(3, 6))
        self.rec = P.orthogonal(nn.Linear(6, 6, bias=False), orthogonal_map=orthogonal_map)
        self.out = nn.Linear(6, 6)
        nn.utils.parametrize.register_parametrization(self.out, "weight", Symmetric())
        self.head = nn.Linear(6, 2)

    def forward(self, xs):
        h = torch.zeros(xs.shape[1], 6)
        with nn.utils.parametrize.cached():
            for x in xs:
                h = torch.tanh(self.inp(x) + self.rec(h))
        return self.head(F.relu(self.out(h)))


@pytest.mark.parametrize("orthogonal_map", ["matrix_exp", "cayley", "householder"])
def test_orthogonal_weight_norm_and_custom_parametrizations_train_cleanly(orthogonal_map):
    """Modelled on the PyTorch "Parametrizations" tutorial: `register_parametrization` with a
    `right_inverse`, the tutorial's initialisation by assignment (`layer.weight = X`, which writes
    `parametrizations.weight.original` in place under no_grad) before training, `parametrize.cached()`
    around the unrolled loop; with `parametrizations.orthogonal` (each map) and `weight_norm`;
    RMSprop for 3 steps, and the orthogonality of the recurrent kernel checked at the end."""

    def build():
        model = OrthoRNN(orthogonal_map)
        with torch.no_grad():
            A = torch.randn(6, 6)
            model.out.weight = A + A.T  # tutorial: "initialize by assignment", through right_inverse
        return {"model": model, "optimizer": torch.optim.RMSprop(model.parameters(), lr=1e-2), "losses": []}

    def train(objs):
        model, optimizer = objs["model"], objs["optimizer"]
        for _ in range(3):
            xs, y = torch.randn(4, 5, 3), torch.randint(0, 2, (5,))
            loss = F.cross_entropy(model(xs), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            objs["losses"].append(loss.detach())
        with torch.no_grad():
            Q = model.rec.weight
            assert torch.allclose(Q @ Q.T, torch.eye(6), atol=1e-4)
            objs["losses"].append(Q.clone())
        return objs["losses"]

    twin_recorded(build, train, lambda o: (o["model"],))


# ---------------------------------------------------------------------------
# 7. Lookahead
# ---------------------------------------------------------------------------

LA_FILE = IDIOMS / "lookahead.py"


@pytest.mark.parametrize("form", ["zhang_none", "zhang_pullback", "zhang_reset", "timm_copy", "timm_real"])
def test_lookahead_slow_weights_and_evaluation_on_them_are_clean(form):
    """Modelled on michaelrzhang/lookahead lookahead_pytorch.py (`p.data.mul_(alpha).add_(1-alpha,
    cached)`, `cached.copy_(p.data)`, the three `pullback_momentum` modes; the README's evaluation on
    the slow weights between `_backup_and_load_cache()` and `_clear_and_load_backup()`) and
    timm/optim/lookahead.py (`slow.add_(fast_p - slow, alpha=...)`, `fast_p.copy_(slow)` under no_grad
    every k steps, `sync_lookahead()` before validation as timm train.py does; "timm_real" is the
    installed timm.optim.Lookahead)."""
    if form == "timm_real":
        pytest.importorskip("timm")
    la = load("lookahead")
    twin_recorded(lambda: la.build(form), la.train, la.modules)


def test_lookahead_slow_weight_evaluation_restored_before_backward_is_clean():
    """Zhang's README evaluation on the slow weights, placed between a training forward and its
    backward (logging the slow weights' loss on the batch): `p.data.copy_(cached)` and then
    `p.data.copy_(backup)` rewrite the weights the forward saved, but put the same bytes back before
    backward runs. Checked here: the gradients are bit-identical to the same loop without the
    evaluation (and the slow weights do differ from the fast ones at that step). A correct program."""
    la = load("lookahead")

    def run(evaluate: bool):
        torch.manual_seed(0)
        objs = la.build("zhang_none")
        if not evaluate:
            objs["optimizer"]._backup_and_load_cache = objs["optimizer"]._clear_and_load_backup = lambda: None
        torch.manual_seed(1)
        la.train_evaluating_slow_weights_before_backward(objs)
        return objs

    with_eval, without_eval = run(True), run(False)
    assert with_eval["slow_differs"]  # the evaluation really loads other weights
    assert same(with_eval["grads"], without_eval["grads"])  # ... and backward still sees the right ones
    twin_recorded(lambda: la.build("zhang_none"), la.train_evaluating_slow_weights_before_backward, la.modules)


def test_lookahead_slow_weights_left_loaded_during_backward_are_flagged():
    """Hazard: the same evaluation with `_clear_and_load_backup()` moved after `loss.backward()`:
    backward reads the slow weights `_backup_and_load_cache()` wrote through `.data` while the
    forward ran on the fast ones. Checked in plain PyTorch: no error, but other gradients than the
    restore-before-backward order (silent): IPD104 naming the `p.data.copy_(cached)` line."""
    la = load("lookahead")

    def grads(fn):
        torch.manual_seed(0)
        objs = la.build("zhang_none")
        torch.manual_seed(1)
        fn(objs)
        return objs["grads"]

    bad = grads(la.train_restoring_after_backward)
    good = grads(lambda objs: la.train_restoring_after_backward(objs, restore_before_backward=True))
    assert not same(bad, good)  # silently different gradients

    torch.manual_seed(0)
    objs = la.build("zhang_none")
    with ipd.watch(objs["model"]) as session:
        la.train_restoring_after_backward(objs)
    hits = [f for f in session.findings if f.code == "IPD104" and f.severity is Severity.ERROR
            and Path(f.mutation.file or "") == LA_FILE and f.mutation.line == marker(LA_FILE, "zhang-load-cache")]
    assert hits, describe(session.findings)


def test_timm_lookahead_sync_between_forward_and_backward_is_flagged():
    """Hazard: timm's `sync_lookahead()` (slow update, then `fast_p.copy_(slow)` under no_grad)
    called between the forward and `loss.backward()`. The Linear layers saved the fast weights;
    plain PyTorch raises (checked): IPD101 naming the `fast_p.copy_(slow)` line as the write."""
    la = load("lookahead")
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        la.train_syncing_before_backward(la.build("timm_copy"))
    torch.manual_seed(0)
    objs = la.build("timm_copy")
    with pytest.raises(ipd.InplaceError), ipd.watch(objs["model"]) as session:
        la.train_syncing_before_backward(objs)
    hits = [f for f in session.findings if f.code == "IPD101" and f.severity is Severity.ERROR
            and Path(f.mutation.file or "") == LA_FILE and f.mutation.line == marker(LA_FILE, "timm-fast-copy")]
    assert hits, describe(session.findings)


# ---------------------------------------------------------------------------
# 8. the idiom scripts under `inplace-doctor run`
# ---------------------------------------------------------------------------

FINDING_LINE = re.compile(r"^(error|warning)\s+IPD\d{3}\b")
SCRIPTS = ["sam", "ppo_cleanrl", "lookahead"]


@pytest.fixture(scope="module")
def scripts_run() -> subprocess.CompletedProcess[str]:
    """`python -m inplace_doctor run tests/real_code/idioms_more/run_all.py`: the idiom scripts,
    each run as `__main__` in turn, in one watched interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "inplace_doctor", "run", str(IDIOMS / "run_all.py"), *SCRIPTS],
        capture_output=True, text=True, timeout=240, cwd=REPO,
        env={**os.environ, "NO_COLOR": "1", "OMP_NUM_THREADS": "1"},
    )


def finding_blocks(stderr: str) -> list[str]:
    blocks, current = [], None
    for line in stderr.splitlines():
        if FINDING_LINE.match(line):
            current = [line]
            blocks.append(current)
        elif current is not None:
            if not line.strip():
                current = None
            else:
                current.append(line)
    return ["\n".join(b) for b in blocks]


def test_more_idiom_scripts_under_inplace_doctor_run_exit_zero_with_no_finding(scripts_run):
    """SAM (all four forms), CleanRL PPO and the Lookahead wrappers as scripts: exit 0, every
    script's output, no error/warning finding, no traceback."""
    out = scripts_run.stdout.splitlines()
    assert [line[3:] for line in out if line.startswith("== ")] == SCRIPTS, scripts_run.stderr[-3000:]
    assert scripts_run.returncode == 0, scripts_run.stderr[-4000:]
    assert not finding_blocks(scripts_run.stderr), scripts_run.stderr[-4000:]
    assert "Traceback" not in scripts_run.stderr, scripts_run.stderr[-4000:]
    assert sum(line.endswith(" ok") for line in out) == 4 + 1 + 4, scripts_run.stdout
