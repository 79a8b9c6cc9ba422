import json

import pytest

from pagebench.config import KVGeometry, parse_bytes, preset_config
from pagebench.errors import ConfigError


def test_qwen_05b_bytes_per_token_and_block():
    g = KVGeometry.from_name("qwen2.5-0.5b")
    assert g.bytes_per_token == 12_288
    assert g.bytes_per_block(16) == 196_608
    assert g.with_dtype("float32").bytes_per_token == 24_576


@pytest.mark.parametrize("name,per_token", [("llama-3-8b", 131_072), ("llama-3-70b", 327_680),
                                            ("mistral-7b", 131_072), ("qwen2.5-7b", 57_344)])
def test_presets(name, per_token):
    assert KVGeometry.from_name(name).bytes_per_token == per_token


def test_from_transformers_config_and_json(tmp_path):
    cfg = preset_config("qwen2.5-0.5b", num_hidden_layers=2)
    g = KVGeometry.from_config(cfg, dtype="bfloat16")
    assert (g.num_layers, g.num_kv_heads, g.head_dim, g.num_q_heads) == (2, 2, 64, 14)
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512,
         "torch_dtype": "float16"}))
    g = KVGeometry.from_name(str(tmp_path))
    assert g.num_kv_heads == 8 and g.head_dim == 64 and g.dtype == "float16"


def test_bad_geometry_and_sizes():
    with pytest.raises(ConfigError, match="num_q_heads"):
        KVGeometry(2, 3, 64, 4)
    with pytest.raises(ConfigError, match="unknown model"):
        KVGeometry.from_name("no-such-model")
    with pytest.raises(ConfigError, match="dtype"):
        KVGeometry(2, 2, 64, 4, dtype="int3")
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("1.5GB") == 1_500_000_000
    with pytest.raises(ConfigError):
        parse_bytes("lots")


def test_environment_commit_can_be_overridden(monkeypatch):
    """A copied tree (a remote GPU machine's) may carry a stale .git: PAGEBENCH_COMMIT wins."""
    from pagebench.measure import timing
    timing.git_commit.cache_clear()
    monkeypatch.setenv("PAGEBENCH_COMMIT", "feedbee")
    try:
        assert timing.environment()["commit"] == "feedbee"
    finally:
        monkeypatch.delenv("PAGEBENCH_COMMIT")
        timing.git_commit.cache_clear()
    assert timing.environment()["commit"] != "feedbee"


def test_commit_says_dirty_when_tracked_files_differ_from_head(monkeypatch, tmp_path):
    """Rows timed on uncommitted code carried the clean commit's hash."""
    import subprocess

    from pagebench.measure import timing

    repo = tmp_path / "repo"
    (repo / "pagebench" / "measure").mkdir(parents=True)
    (repo / "pagebench" / "measure" / "timing.py").write_text("x = 1\n")

    def git(*args):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                        *args], check=True, capture_output=True)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    monkeypatch.delenv("PAGEBENCH_COMMIT", raising=False)
    monkeypatch.setattr(timing, "__file__", str(repo / "pagebench" / "measure" / "timing.py"))
    timing.git_commit.cache_clear()
    try:
        clean = timing.git_commit()
        assert clean and "dirty" not in clean
        (repo / "pagebench" / "measure" / "timing.py").write_text("x = 2\n")
        (repo / "untracked.txt").write_text("not measured\n")
        timing.git_commit.cache_clear()
        assert timing.git_commit() == f"{clean}-dirty"
    finally:
        timing.git_commit.cache_clear()
