"""Files written atomically: errors name the file asked for, never the temporary file beside it;
and a path can be checked for writing before any work is done."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import nbbudget as nb
from nbbudget.core.files import atomic_write, check_target


def test_a_write_into_a_missing_folder_names_the_path_asked_for(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "t.json"
    with pytest.raises(FileNotFoundError) as info:
        atomic_write(target, b"{}")
    assert info.value.filename == str(target)
    assert ".tmp" not in str(info.value)
    assert not (tmp_path / "no").exists()


def test_saving_a_trace_into_a_missing_folder_names_the_trace_path(tmp_path: Path) -> None:
    with nb.budget() as run:
        pass
    target = tmp_path / "missing" / "trace.json"
    with pytest.raises(FileNotFoundError, match=f"{str(target)!r}$"):
        run.trace.save(target)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_write_into_a_read_only_folder_names_the_path_asked_for(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    with pytest.raises(PermissionError) as info:
        atomic_write(folder / "t.json", b"{}")
    assert info.value.filename == str(folder / "t.json")
    assert list(folder.iterdir()) == []


def test_check_target_accepts_a_new_or_existing_file_in_an_existing_folder(tmp_path: Path) -> None:
    check_target(str(tmp_path / "new.json"))
    (tmp_path / "old.json").write_text("{}")
    check_target(str(tmp_path / "old.json"))
    check_target("relative-name.json")  # the current folder


def test_check_target_refuses_a_missing_folder_naming_the_path(tmp_path: Path) -> None:
    target = tmp_path / "no" / "t.json"
    assert target_error(target) == (
        f"{str(target)!r}: the folder {str(target.parent)!r} does not exist; create it or "
        f"choose another path")


def test_check_target_refuses_a_folder_naming_a_file_in_it(tmp_path: Path) -> None:
    assert target_error(tmp_path) == (
        f"{str(tmp_path)!r} is a folder; name a file in it, e.g. "
        f"{str(tmp_path / 'trace.json')!r}")


def test_check_target_refuses_a_file_taken_for_a_folder(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("")
    target = tmp_path / "file.txt" / "t.json"
    assert target_error(target) == (
        f"{str(target)!r}: {str(target.parent)!r} is not a folder; choose another path")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_check_target_refuses_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    assert target_error(folder / "t.json") == (
        f"{str(folder / 't.json')!r}: the folder {str(folder)!r} is not writable; choose "
        f"another path")


def target_error(path: Path | str) -> str:
    with pytest.raises(nb.ConfigError) as info:
        check_target(str(path))
    return str(info.value)


def test_check_target_refuses_a_null_character_naming_the_path() -> None:
    assert target_error("a\0b.json") == (
        "'a\\x00b.json' is not a file path: it holds a null character")


def test_check_target_refuses_an_empty_path() -> None:
    assert target_error("") == "'' is not a file path: it is empty"
