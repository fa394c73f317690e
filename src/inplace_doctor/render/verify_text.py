"""A VerifyResult as text (`str(result)`) and in a notebook (`result._repr_html_()`)."""

from __future__ import annotations

import html

from ..engines.verify import VerifyResult
from ..printing import renders_html, renders_text
from ..verification import ModelVerified


@renders_text(VerifyResult)
def verify_to_plain_text(result: VerifyResult) -> str:
    """Equivalent, or the first differences and the responsible sites, or what the configured run raised."""
    if result.error is not None:
        lines = [f"not equivalent: the in-place configuration raised: {result.error}"]
        lines += [f"  {f.code} {f.message.splitlines()[0]}" for f in result.findings]
        return "\n".join(lines)
    if result.equivalent:
        lines = [
            (
                f"equivalent: outputs, loss, gradients, buffers and inputs match the out-of-place program "
                f"({len(result.sites)} in-place sites, {result.runs} runs)"
            )
        ]
    else:
        lines = [f"not equivalent: {result.differences[0]}"]
        lines += [f"  also {d}" for d in result.differences[1:5]]
        if result.culprits:
            lines.append("responsible: " + "; ".join(str(c) for c in result.culprits))
    notes = result.notes
    lines += [f"note: {n}" for n in notes[:5]]
    if len(notes) > 5:
        lines.append(f"note: and {len(notes) - 5} more tensors with NaN/inf in both runs at the same places")
    return "\n".join(lines)


@renders_html(VerifyResult)
def verify_to_html(result: VerifyResult) -> str:
    """Jupyter: `str(result)` in a <pre>, green when equivalent, red when not (escaped, no script)."""
    color = "#2e7d32" if result.equivalent else "#b00020"
    return f'<pre class="inplace-doctor-verify" style="white-space:pre-wrap;color:{color}">{html.escape(str(result))}</pre>'


@renders_text(ModelVerified)
def model_note(verified: ModelVerified) -> str:
    """`run --verify`'s verdict on one model as the report's note (`verify: `Net` (train mode, ...): equivalent: ...`)."""
    if verified.result is None:
        if verified.label:
            return f"verify: `{verified.label}` could not be verified: {verified.reason}"
        return f"verify: {verified.reason}"
    text = str(verified.result).splitlines()
    mode = "train" if verified.training else "eval"
    head = f"verify: `{verified.label}` ({mode} mode, on the arguments of its first call): {text[0]}"
    return "\n".join([head, *("  " + line for line in text[1:])])
