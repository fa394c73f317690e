"""Training-framework integrations: callbacks that watch the first N steps of a real fit.

`inplace_doctor.integrations.lightning.InplaceDoctorCallback` (Lightning) and
`inplace_doctor.integrations.transformers.InplaceDoctorCallback` (the Hugging Face
`Trainer`) open one `ipd.watch()` window at the start of the first training step and
close it after the N-th optimizer step, then report and, on a finding at or above
`fail_on`, fail the fit with `InplaceHazardsFound`.

This room sits on top: it may import `api` (the public face) and, for whose-exception-it-is
bookkeeping, `trace.blame`; nothing of the package imports it. Importing this folder imports
neither Lightning nor transformers: each framework is imported only by its own module, when
that module is imported (they are optional extras: `pip install inplace-doctor[lightning]`,
`inplace-doctor[transformers]`).
"""

from __future__ import annotations

from .window import InplaceHazardsFound

__all__ = ["InplaceHazardsFound"]
