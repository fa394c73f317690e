"""The byte-preserving apply engine of `inplace-doctor fix`: `Edit` records spliced into files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inplace_doctor.cli.proof.source_edits import (
    EditError,
    Source,
    already_made,
    apply_to_source,
    plan,
    unified_diff,
    write_all,
)
from inplace_doctor.findings import Applicability, Edit, Fix, FixKind, Position


def at(line: int, column: int) -> Position:
    return Position(line, column)


def insert_clone(path: str, line: int, indent: int) -> Edit:
    return Edit(path, at(line, indent), at(line, indent), "", "h = h.clone()\n" + " " * indent)


SCRIPT = "import torch\n\n\ndef f(x):\n    h = torch.sigmoid(x)\n    h.mul_(2)  # the write\n    return h\n"


def test_a_crlf_file_keeps_every_crlf_and_the_inserted_line_ends_in_crlf(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_bytes(SCRIPT.replace("\n", "\r\n").encode())
    (before, after), = plan([insert_clone("m.py", 6, 4)], str(tmp_path)).values()
    assert before == path.read_bytes()
    assert after == before.replace(b"    h.mul_(2)", b"    h = h.clone()\r\n    h.mul_(2)")
    assert b"\n" not in after.replace(b"\r\n", b"")  # no bare LF crept in


def test_a_file_with_a_bom_keeps_it_and_columns_count_characters_after_it(tmp_path: Path) -> None:
    text = SCRIPT.replace("# the write", "# écrit ici")
    path = tmp_path / "m.py"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    # replace `h.mul_(2)` (line 6, columns 4..13) with `h = h.mul(2)`
    edit = Edit("m.py", at(6, 4), at(6, 13), "h.mul_(2)", "h = h.mul(2)")
    (before, after), = plan([edit], str(tmp_path)).values()
    assert after == before.replace(b"    h.mul_(2)", b"    h = h.mul(2)")
    assert after.startswith(b"\xef\xbb\xbf")


def test_a_latin1_file_with_a_coding_line_changes_only_the_edited_bytes(tmp_path: Path) -> None:
    text = "# -*- coding: latin-1 -*-\n" + SCRIPT.replace("h.mul_(2)  # the write", "h.mul_(2); s = 'é'  # écrit")
    path = tmp_path / "m.py"
    path.write_bytes(text.encode("latin-1"))
    # the column counts characters: `é` is one character (one byte in latin-1, two in UTF-8)
    edit = Edit("m.py", at(7, 4), at(7, 13), "h.mul_(2)", "h = h.mul(2)")
    (before, after), = plan([edit], str(tmp_path)).values()
    assert after == before.replace(b"h.mul_(2);", b"h = h.mul(2);")
    assert b"'\xe9'" in after and "é".encode() not in after
    # an edit after a non-ASCII character on its line lands where the characters say
    late = Edit("m.py", at(7, 19), at(7, 22), "'é'", "'ê'")
    (_, after), = plan([late], str(tmp_path)).values()
    assert after == before.replace(b"'\xe9'", b"'\xea'")


def test_an_edit_whose_text_moved_is_refused_as_changed_since_the_run(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(SCRIPT.replace("    h.mul_(2)", "    h = h + 0\n    h.mul_(2)"))
    edit = Edit("m.py", at(6, 4), at(6, 13), "h.mul_(2)", "h = h.mul(2)")
    with pytest.raises(EditError, match=r"m.py changed since the run: line 6 reads 'h = h \+ 0' where the run saw 'h.mul_\(2\)'"):
        plan([edit], str(tmp_path))


def test_an_edit_that_would_not_parse_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(SCRIPT)
    edit = Edit("m.py", at(6, 4), at(6, 13), "h.mul_(2)", "h = = h.mul(2)")
    with pytest.raises(EditError, match="would not parse"):
        plan([edit], str(tmp_path))


def test_overlapping_edits_are_refused(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(SCRIPT)
    one = Edit("m.py", at(6, 4), at(6, 13), "h.mul_(2)", "h = h.mul(2)")
    two = Edit("m.py", at(6, 6), at(6, 13), "mul_(2)", "mul(3)")
    with pytest.raises(EditError, match="overlap"):
        plan([one, two], str(tmp_path))


def test_edits_across_files_are_written_all_or_nothing(tmp_path: Path) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(SCRIPT)
    b.write_text(SCRIPT)
    changes = plan([insert_clone("a.py", 6, 4), insert_clone("b.py", 6, 4)], str(tmp_path))
    b.write_text(SCRIPT + "# changed while fix ran\n")  # the second file no longer holds what was read
    with pytest.raises(EditError, match="changed while fix ran; nothing was written"):
        write_all(changes)
    assert a.read_text() == SCRIPT  # the first was not written either
    assert sorted(os.listdir(tmp_path)) == ["a.py", "b.py"]  # no temporary file left behind
    b.write_text(SCRIPT)
    write_all(changes)
    assert a.read_text() == b.read_text() == SCRIPT.replace("    h.mul_", "    h = h.clone()\n    h.mul_")


def test_a_failed_replace_puts_back_the_files_already_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(SCRIPT)
    b.write_text(SCRIPT)
    changes = plan([insert_clone("a.py", 6, 4), insert_clone("b.py", 6, 4)], str(tmp_path))
    real_replace, calls = os.replace, []

    def replace(src: str, dst: str) -> None:  # the second file's rename fails (a full disk, a lost mount)
        calls.append(dst)
        if dst == str(b):
            raise OSError(28, "No space left on device", dst)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(EditError, match="every file is as it was"):
        write_all(changes)
    assert a.read_text() == b.read_text() == SCRIPT
    assert calls == [str(a), str(b), str(a)]  # a put back by a rename too, not rewritten in place
    assert sorted(os.listdir(tmp_path)) == ["a.py", "b.py"]  # no temporary file left behind


def test_the_diff_shows_the_bytes_it_will_write(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_bytes(SCRIPT.replace("\n", "\r\n").encode())
    patch = unified_diff(plan([insert_clone("m.py", 6, 4)], str(tmp_path)), str(tmp_path))
    assert b"+    h = h.clone()\r\n" in patch and patch.startswith(b"--- a/m.py")


def test_fixes_read_back_from_the_json_report_are_the_records() -> None:
    fix = Fix(FixKind.CLONE_BEFORE_WRITE, (insert_clone("m.py", 6, 4),), Applicability.UNSAFE)
    assert Fix.from_dict(fix.to_dict()) == fix
    assert Fix.from_dict({**fix.to_dict(), "kind": "a-kind-of-a-newer-report"}).kind is FixKind.OTHER


def test_source_reads_a_lone_cr_as_a_line_end() -> None:
    assert Source(b"a = 1\rb = 2\r\nc = 3\n", "utf-8", 0).line_starts() == [0, 6, 13, 19]
    assert apply_to_source("m.py", Source(b"a = 1\rb = 2\r", "utf-8", 0),
                           [Edit("m.py", at(2, 0), at(2, 0), "", "c = 0\n")]) == b"a = 1\rc = 0\rb = 2\r"


def test_an_insertion_whose_line_already_stands_right_above_is_the_same_edit_again() -> None:
    # issue 23, item 2: `buf = buf.clone()` inserted before the same statement round after round
    once = SCRIPT.replace("    h.mul_(2)", "    h = h.clone()\n    h.mul_(2)").replace("\n", "\r\n").encode()
    assert already_made(insert_clone("m.py", 7, 4), Source(once, "utf-8", 0))
    assert not already_made(insert_clone("m.py", 6, 4), Source(SCRIPT.encode(), "utf-8", 0))
    other = SCRIPT.replace("    h.mul_(2)", "    gh = h.clone()\n    h.mul_(2)").encode()
    assert not already_made(insert_clone("m.py", 7, 4), Source(other, "utf-8", 0))
