"""Feedback back to the attendees: on the hub into mywork/feedback/, in a laptop room as a zip each."""

from __future__ import annotations

import zipfile

import pytest

from packlab.course.grade import classbook, cli, handback
from packlab.course.grade.classbook import GradebookRow


def _rows(attendee: str) -> list[GradebookRow]:
    return [GradebookRow(attendee, "01_jpeg_dataset", "jpeg_dataset", "length", 1, 1, status="passed"),
            GradebookRow(attendee, "01_jpeg_dataset", "ALL", "TOTAL", 1, 1),
            GradebookRow(attendee, "ALL", "ALL", "TOTAL", 1, 1)]


@pytest.fixture
def hub(tmp_path):
    """A class hub's folder: two attendees with a course copy each, and their hand-ins in dropbox/."""
    hub = tmp_path / "hub"
    for name in ("alice", "bob"):
        (hub / "users" / name / "course" / "mywork" / "exercises").mkdir(parents=True)
        (hub / "dropbox" / name / "exercises").mkdir(parents=True)
        (hub / "dropbox" / name / "exercises" / "01_jpeg_dataset.md").write_text("# handed in\n")
    return hub


def test_only_a_hubs_drop_folder_is_taken_for_a_hub(hub, tmp_path):
    assert handback.hub_of(hub / "dropbox") == hub.resolve()
    assert handback.hub_of(tmp_path) is None
    (tmp_path / "class" / "dropbox").mkdir(parents=True)
    assert handback.hub_of(tmp_path / "class" / "dropbox") is None  # a folder named dropbox, with no users/ beside it


def test_the_gradebook_on_a_hub_puts_each_attendees_feedback_into_their_own_mywork(hub, monkeypatch, capsys):
    def graded(folder, *args, grades=None, **kwargs):
        return [row for name in ("alice", "bob", "carol") for row in _rows(name)]

    monkeypatch.setattr(classbook, "grade_class", graded)
    status = cli.main(["--class", str(hub / "dropbox"), "--no-sandbox", "--feedback", str(hub / "dropbox" / "feedback")])
    assert status == 0
    for name in ("alice", "bob"):
        delivered = hub / "users" / name / "course" / "mywork" / "feedback" / f"{name}.md"
        assert delivered.read_text() == (hub / "dropbox" / "feedback" / f"{name}.md").read_text()
        assert f"# Feedback for {name}" in delivered.read_text()
        assert not list(delivered.parent.glob(".*partial"))
    assert not (hub / "users" / "carol").exists()
    out = capsys.readouterr().out
    assert "into 2 attendee(s)' mywork/feedback/ on the hub" in out and "no course copy on the hub for carol" in out


def test_a_laptop_rooms_handback_holds_only_the_feedback_folder_and_the_attendee_takes_it(hub, tmp_path):
    class_dir = hub / "dropbox"
    classbook.write_feedback(_rows("alice") + _rows("bob"), {}, class_dir / "feedback")
    zips = handback.handback_zips(class_dir)
    assert [z.name for z in zips] == ["alice.zip", "bob.zip"]
    with zipfile.ZipFile(zips[0]) as packed:
        assert sorted(packed.namelist()) == ["mywork/feedback/alice.md", "mywork/feedback/handed-in/01_jpeg_dataset.md"]

    checkout = tmp_path / "alice-laptop"
    mine = checkout / "mywork" / "exercises" / "01_jpeg_dataset.md"
    mine.parent.mkdir(parents=True)
    mine.write_text("# my work since\n")
    written = handback.take_feedback(zips[0], checkout)
    assert {p.relative_to(checkout).as_posix() for p in written} == {
        "mywork/feedback/alice.md", "mywork/feedback/handed-in/01_jpeg_dataset.md"}
    assert mine.read_text() == "# my work since\n", "the attendee's own copy is never overwritten"


@pytest.mark.parametrize("member", ["mywork/exercises/01_jpeg_dataset.md", "../evil.md", "/etc/evil",
                                    "mywork/feedback/../../Makefile", "mywork/feedback"])
def test_a_zip_with_anything_outside_mywork_feedback_is_refused_whole(tmp_path, member):
    archive = tmp_path / "odd.zip"
    with zipfile.ZipFile(archive, "w") as packed:
        packed.writestr("mywork/feedback/alice.md", "fine\n")
        packed.writestr(member, "not fine\n")
    with pytest.raises(handback.HandbackError, match="outside mywork/feedback/; nothing was unpacked"):
        handback.take_feedback(archive, tmp_path / "checkout")
    assert not (tmp_path / "checkout").exists()


def test_handback_before_the_gradebook_and_a_broken_zip_say_what_to_do(tmp_path, capsys):
    assert handback.main(["--class", str(tmp_path)]) == 2
    assert "run `make gradebook CLASS=" in capsys.readouterr().err
    cut = tmp_path / "cut.zip"
    cut.write_bytes(b"PK\x03\x04 not really")
    assert handback.main(["--take", str(cut), "--root", str(tmp_path)]) == 2
    assert "is not a zip file" in capsys.readouterr().err
    assert handback.main(["--take", str(tmp_path / "none.zip"), "--root", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
