"""Both training callbacks print the same one summary line after a clean window, as a user running
the program sees it: a fresh interpreter with logging as the frameworks leave it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LIGHTNING = """
    import lightning.pytorch as pl
    import torch
    from inplace_doctor.integrations.lightning import InplaceDoctorCallback

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = pl.Trainer(max_steps=3, callbacks=[InplaceDoctorCallback(steps=2)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=4))
"""

TRANSFORMERS = """
    import sys
    import torch
    import transformers
    from inplace_doctor.integrations.transformers import InplaceDoctorCallback

    config = transformers.GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2)
    rows = torch.randint(0, 32, (16, 8), generator=torch.Generator().manual_seed(0))
    tokens = [{"input_ids": row, "labels": row} for row in rows]
    args = transformers.TrainingArguments(sys.argv[1], max_steps=3, per_device_train_batch_size=4, report_to=[],
                                          save_strategy="no", logging_strategy="no", use_cpu=True,
                                          disable_tqdm=sys.argv[2] == "no-bar")
    model = transformers.GPT2LMHeadModel(config)
    transformers.Trainer(model=model, args=args, train_dataset=tokens, callbacks=[InplaceDoctorCallback(steps=2)]).train()
"""


def printed_summaries(program: str, tmp_path: Path, *argv: str) -> list[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(program))
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = done.stdout + done.stderr
    return [line[line.index("inplace-doctor"):] for line in seen.splitlines() if "inplace-doctor" in line]


def test_the_lightning_callback_prints_one_line_on_a_clean_fit(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    assert printed_summaries(LIGHTNING, tmp_path) == [
        "inplace-doctor watched 2 training step(s) of Lightning fit of Regressor: no finding"
    ]


@pytest.mark.parametrize("bar", ["no-bar", "bar"])
def test_the_hugging_face_callback_prints_the_same_line_on_a_clean_run(tmp_path: Path, bar: str) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    assert printed_summaries(TRANSFORMERS, tmp_path, str(tmp_path / "out"), bar) == [
        "inplace-doctor watched 2 training step(s) of Trainer.train of GPT2LMHeadModel: no finding"
    ]
