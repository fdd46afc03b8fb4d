"""What `--resume` accepts: the run's own config, with only how it runs changed, including
a config written by an older tracerl (which lacks the keys added since, at their
defaults); anything that changes what the run learns is refused, naming the key."""

from __future__ import annotations

import pytest
import yaml

from tracerl.config import RunConfig, dump_config
from tracerl.errors import UserError
from tracerl.train.resume import check_resumable


def _started(tmp_path, cfg: RunConfig, *, drop=()):
    """A run directory whose config.yaml is `cfg`'s, without the keys `drop` (an older
    tracerl that did not have them)."""
    data = yaml.safe_load(dump_config(cfg))
    for key in drop:
        *parents, leaf = key.split(".")
        node = data
        for p in parents:
            node = node[p]
        node.pop(leaf)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


def test_a_config_from_an_older_tracerl_resumes_and_changes_are_still_refused(tmp_path):
    cfg = RunConfig(name="r")
    newer = ("env.allow_real_writes", "trainer.stop_unlearnable_steps")
    run = _started(tmp_path, cfg, drop=newer)
    check_resumable(run, cfg.model_dump(mode="json"))  # the new keys at their defaults
    more = cfg.model_copy(update={"trainer": cfg.trainer.model_copy(update={"steps": 99})})
    check_resumable(run, more.model_dump(mode="json"))  # how long it runs may change

    other = cfg.model_copy(deep=True)
    other.trainer.stop_unlearnable_steps = 7  # a new key, not at its default
    with pytest.raises(UserError, match=r"trainer\.stop_unlearnable_steps \(None -> 7\)"):
        check_resumable(run, other.model_dump(mode="json"))
    other = cfg.model_copy(deep=True)
    other.trainer.lr = 1e-3
    with pytest.raises(UserError, match=r"another config: trainer\.lr"):
        check_resumable(run, other.model_dump(mode="json"))
