"""Hugging Face transformers models built from small configs (random weights): audited clean
in train mode, and a hazard planted in one of them is reported with both sites."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inplace_doctor as ipd

transformers = pytest.importorskip("transformers")


def _bert():
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    return transformers.BertModel(config), {"input_ids": torch.randint(0, 100, (2, 8))}


def _gpt2():
    config = transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    ids = torch.randint(0, 100, (2, 8))
    return transformers.GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}


def _t5():
    config = transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2, decoder_start_token_id=0
    )
    return transformers.T5ForConditionalGeneration(config), {
        "input_ids": torch.randint(0, 100, (2, 8)),
        "labels": torch.randint(0, 100, (2, 6)),
    }


def _vit():
    config = transformers.ViTConfig(
        image_size=16, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=3,
    )
    return transformers.ViTForImageClassification(config), {
        "pixel_values": torch.randn(2, 3, 16, 16),
        "labels": torch.tensor([0, 2]),
    }


MODELS = {"bert": _bert, "gpt2": _gpt2, "t5": _t5, "vit": _vit}


def _loss(kwargs):
    return (lambda out: out.loss) if "labels" in kwargs else (lambda out: out.last_hidden_state.sum())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_small_transformers_audit_clean_in_train_mode(name: str) -> None:
    torch.manual_seed(0)
    model, kwargs = MODELS[name]()
    model.train()
    report = ipd.audit(model, loss_fn=_loss(kwargs), **kwargs)
    assert report.findings == [], str(report)
    assert report.backward and report.stats["saved_tensors"] > 0


def test_a_training_step_with_adamw_under_watch_is_clean() -> None:
    torch.manual_seed(0)
    model, kwargs = _gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with ipd.watch(model) as session:
        for _ in range(2):
            opt.zero_grad()
            model(**kwargs).loss.backward()
            opt.step()
    assert session.findings == []


def test_a_hazard_planted_in_bert_is_reported_with_both_sites() -> None:
    torch.manual_seed(0)
    model, kwargs = _bert()
    model.pooler.activation = nn.Sequential(nn.Tanh(), nn.ReLU(inplace=True))  # Tanh saved its output
    report = ipd.audit(model, loss_fn=lambda out: out.pooler_output.sum(), **kwargs)
    assert report.codes == ["IPD101"]
    finding = report.findings[0]
    assert finding.mutation.module == "pooler.activation.1"
    assert finding.saved is not None and finding.saved.module == "pooler.activation.0"
    assert finding.slot == "TanhBackward0.result"
