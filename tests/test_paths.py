from pathlib import Path

from packlab import paths


def test_default_data_root_is_in_the_repository(monkeypatch, tmp_path):
    monkeypatch.setenv("PACKLAB_SETTINGS", str(tmp_path / "no-settings.mk"))
    monkeypatch.delenv(paths.DATA_ENV_VAR, raising=False)
    assert paths.data_root() == paths.repo_root() / "data"
    assert (paths.repo_root() / "packlab" / "paths.py").is_file()


def test_packlab_data_moves_the_data_root(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.DATA_ENV_VAR, str(tmp_path / "scratch"))
    assert paths.data_root() == (tmp_path / "scratch").resolve()
    assert paths.images_dir() == (tmp_path / "scratch" / "images").resolve()
    assert paths.manifest_path().name == "manifest.csv"
    assert paths.labels_path().name == "labels.csv"
    assert paths.packed_dir().parent == paths.data_root()


def test_explicit_root_wins(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.DATA_ENV_VAR, "/nonexistent")
    assert paths.images_dir(Path(tmp_path)) == tmp_path / "images"
