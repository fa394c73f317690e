"""Audit model zoos: every torchvision builder and timm models up to 30 M parameters.

    . .venv/bin/activate
    python benchmarks/zoo.py --shard 1/4          # a quarter of the list; resumable
    python benchmarks/zoo.py --only torchvision   # or: timm
    python benchmarks/zoo.py --render             # write docs/zoo.md from the results so far

Each model is built with random weights, put in train mode, and audited
(forward + backward; detection models with synthetic targets, their loss dict
summed). Results go to benchmarks/zoo_results.jsonl, one line per model; a
model already there is skipped, so an interrupted run resumes. The whole list
takes hours on a CPU: it is not part of CI. The table records, per model, the
input, the findings by code, the audit's cost as a ratio to a plain forward +
backward in the same process, and the status (ok, or the error it raised).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _torchvision_sizes import classification_size  # benchmarks/ is on sys.path when run as a script

import inplace_doctor as ipd
from inplace_doctor.engines.training import default_loss

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "zoo_results.jsonl"
DOC = ROOT / "docs" / "zoo.md"
TIMM_MAX_PARAMS = 30e6
TIMM_TARGET = 320  # models, spread over families


# -- the model list ---------------------------------------------------------------

def torchvision_entries() -> list[tuple[str, str]]:
    import torchvision

    out = []
    for kind, module in (
        ("classification", torchvision.models),
        ("segmentation", torchvision.models.segmentation),
        ("detection", torchvision.models.detection),
        ("video", torchvision.models.video),
        ("optical_flow", torchvision.models.optical_flow),
        ("quantization", torchvision.models.quantization),  # float, QAT-ready (quantize=False)
    ):
        for name in torchvision.models.list_models(module=module):
            out.append((f"torchvision/{kind}", name))
    return out


def _family(name: str) -> str:
    return re.split(r"[_\d]", name, maxsplit=1)[0]


def timm_entries(target: int = TIMM_TARGET, max_params: float = TIMM_MAX_PARAMS) -> list[tuple[str, str]]:
    """Up to `target` timm models of at most `max_params` (counted on the meta device),
    taken round-robin over families so that every family is represented."""
    import timm

    by_family: dict[str, list[str]] = {}
    for name in timm.list_models():
        by_family.setdefault(_family(name), []).append(name)
    chosen: list[str] = []
    queues = {f: list(names) for f, names in sorted(by_family.items())}
    while len(chosen) < target and any(queues.values()):
        for family in list(queues):
            while queues[family]:
                name = queues[family].pop(0)
                if _timm_params(name) <= max_params:
                    chosen.append(name)
                    break
            if len(chosen) >= target:
                break
    return [("timm", n) for n in chosen]


def _timm_params(name: str) -> float:
    import timm

    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
        return float(sum(p.numel() for p in model.parameters()))
    except Exception:
        return float("inf")


# -- building and auditing ------------------------------------------------------------

def build(
    source: str, name: str, full_size: bool = False
) -> tuple[torch.nn.Module, tuple[Any, ...], Callable[[Any], torch.Tensor] | None, str]:
    torch.manual_seed(0)
    if source == "timm":
        import timm

        model = timm.create_model(name, pretrained=False)
        cfg = getattr(model, "pretrained_cfg", None) or {}
        c, h, w = cfg.get("input_size", (3, 224, 224))
        if not cfg.get("fixed_input_size", False) and not full_size:
            h, w = min(h, 96), min(w, 96)
        x = torch.randn(2, c, h, w)
        return model, (x,), None, f"2x{c}x{h}x{w}"
    import torchvision

    kind = source.split("/", 1)[1]
    if kind in ("classification", "quantization"):
        model = torchvision.models.get_model(name, weights=None)
        size = classification_size(name, 64)
        x = torch.randn(2, 3, size, size)
        return model, (x,), None, f"2x3x{size}x{size}"
    if kind == "segmentation":
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None)
        x = torch.randn(2, 3, 64, 64)
        return model, (x,), lambda out: sum(v.sum() for v in out.values()), "2x3x64x64"
    if kind == "detection":
        sized = {} if name.startswith("ssd") else {"min_size": 128, "max_size": 128}  # SSDs resize to their own size
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None, **sized)
        images = [torch.rand(3, 128, 128), torch.rand(3, 128, 128)]
        second_label = 1 if "keypoint" in name else 2  # keypoint R-CNN has two classes: background and person
        targets = [
            {"boxes": torch.tensor([[10.0, 10.0, 60.0, 70.0]]), "labels": torch.tensor([1])},
            {"boxes": torch.tensor([[20.0, 30.0, 90.0, 100.0]]), "labels": torch.tensor([second_label])},
        ]
        if "keypoint" in name:
            for t in targets:
                t["keypoints"] = torch.rand(1, 17, 3) * 60
        if "mask" in name:
            for t in targets:
                t["masks"] = torch.zeros(1, 128, 128, dtype=torch.uint8)
                t["masks"][:, 20:60, 20:60] = 1
        return model, (images, targets), lambda out: sum(out.values()), "2 images 3x128x128 + targets"
    if kind == "video":
        model = torchvision.models.get_model(name, weights=None)
        frames = 16 if name.startswith(("mvit", "s3d")) else 4
        size = 224 if name.startswith(("mvit", "s3d")) else 64
        x = torch.randn(1, 3, frames, size, size)
        return model, (x,), None, f"1x3x{frames}x{size}x{size}"
    model = torchvision.models.get_model(name, weights=None)  # optical flow
    a, b = torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128)
    return model, (a, b), lambda out: out[-1].sum(), "2 frames 1x3x128x128"


def _plain_seconds(model: torch.nn.Module, args: tuple[Any, ...], loss_fn: Any) -> float:
    start = time.perf_counter()
    out = model(*args)
    loss = loss_fn(out) if loss_fn else default_loss(out)
    if loss is not None:
        loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def audit_one(source: str, name: str) -> dict[str, Any]:
    row: dict[str, Any] = {"source": source, "model": name}
    try:
        model, args, loss_fn, described = build(source, name)
        row["input"] = described
        model.train()
        try:
            _plain_seconds(model, args, loss_fn)  # warm-up
        except AssertionError:  # a timm model whose input-size constraints the reduced size breaks
            model, args, loss_fn, described = build(source, name, full_size=True)
            row["input"] = described
            model.train()
            _plain_seconds(model, args, loss_fn)
        plain = min(_plain_seconds(model, args, loss_fn) for _ in range(2))
        start = time.perf_counter()
        report = ipd.audit(model, *args, loss_fn=loss_fn)
        audited = time.perf_counter() - start
        codes: dict[str, int] = {}
        for f in report.findings:
            codes[f.code] = codes.get(f.code, 0) + 1
        row.update(
            status="ok", findings=codes, cost=round(audited / plain, 2) if plain > 0 else None,
            messages=[f"{f.code} {f.message.splitlines()[0]}" for f in report.findings][:5],
        )
    except Exception as e:
        row.update(status=f"error: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}",
                   trace=traceback.format_exc()[-2000:])
    finally:
        gc.collect()
    return row


# -- results ------------------------------------------------------------------------

def load_results() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    if RESULTS.exists():
        for line in RESULTS.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                out[(row["source"], row["model"])] = row
    return out


def render(results: dict[tuple[str, str], dict[str, Any]]) -> str:
    rows = sorted(results.values(), key=lambda r: (r["source"], r["model"]))
    ok = [r for r in rows if r.get("status") == "ok"]
    flagged = [r for r in ok if r.get("findings")]
    lines = [
        "# Model zoo audit",
        "",
        "Generated by `python benchmarks/zoo.py --render` from `benchmarks/zoo_results.jsonl`.",
        f"torch {torch.__version__}. Every model built with random weights, train mode, one audited",
        "forward + backward. `cost` is the audit's time over a plain forward + backward in the same process,",
        "one timing each, often with other benchmarks sharing the machine: a rough guide (below x1 is noise),",
        "not a benchmark; `benchmarks/overhead.py` measures overhead properly.",
        "",
        f"{len(rows)} models: {len(ok)} audited, {len(rows) - len(ok)} errors, {len(flagged)} with findings.",
        "By source: " + ", ".join(f"{k} {v}" for k, v in sorted(Counter(r["source"] for r in rows).items()))
        + f" (the full list: every torchvision builder and {TIMM_TARGET} timm models; a run resumes where it stopped).",
        f"The timm models come from {len({_family(r['model']) for r in rows if r.get('source') == 'timm'})} families "
        "(taken round-robin, at most 30 M parameters each).",
        "",
        "No model has a finding, so there is no non-clean row to explain. That is a result about these models,"
        " not a blind spot: each rule's tests make it fire on its fixtures (`tests/rules/`)." if not flagged
        else f"{len(flagged)} model(s) have findings (their rows give the codes); explain each here by hand.",
        "",
        "| source | model | input | findings | cost | status |",
        "|---|---|---|---|--:|---|",
    ]
    for r in rows:
        findings = ", ".join(f"{c} x{n}" for c, n in sorted((r.get("findings") or {}).items())) or "clean"
        cost = f"x{r['cost']}" if r.get("cost") is not None else ""
        lines.append(f"| {r['source']} | {r['model']} | {r.get('input', '')} | {findings} | {cost} | {r['status']} |")
    if flagged:
        lines += ["", "## Findings", ""]
        for r in flagged:
            lines.append(f"- **{r['model']}**: " + "; ".join(r.get("messages", [])))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shard", default="1/1", help="i/n: run the i-th of n interleaved parts")
    parser.add_argument("--only", choices=("torchvision", "timm"))
    parser.add_argument("--limit", type=int, help="at most this many models (smoke runs)")
    parser.add_argument("--render", action="store_true", help="only write docs/zoo.md from the results so far")
    ns = parser.parse_args()
    results = load_results()
    if not ns.render:
        i, n = (int(v) for v in ns.shard.split("/"))
        entries = []
        if ns.only in (None, "torchvision"):
            entries += torchvision_entries()
        if ns.only in (None, "timm"):
            entries += timm_entries()
        todo = [e for k, e in enumerate(entries) if k % n == i - 1 and e not in results]
        if ns.limit:
            todo = todo[: ns.limit]
        from rich.progress import Progress

        with Progress(transient=False) as progress, RESULTS.open("a") as out:
            task = progress.add_task("auditing", total=len(todo))
            for source, name in todo:
                progress.update(task, description=f"{source} {name}")
                row = audit_one(source, name)
                out.write(json.dumps(row) + "\n")
                out.flush()
                results[(source, name)] = row
                progress.advance(task)
    DOC.parent.mkdir(exist_ok=True)
    DOC.write_text(render(results))
    print(f"wrote {DOC} ({len(results)} models)", file=sys.stderr)


if __name__ == "__main__":
    main()
