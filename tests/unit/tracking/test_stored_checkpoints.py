"""The score step's check of the committed checkpoints (`gradshare.tracking.store.verified_checkpoints`),
against a real server."""
from __future__ import annotations

from gradshare.tracking import connection



def test_a_corrupted_checkpoint_at_score_is_a_refusal_naming_the_stored_artifact_and_arm(mlflow_server, tmp_path):
    """The score step's check of the committed weights: an unreadable safetensors file is refused (no
    attempt used, nothing scored), naming the arm, its run and the stored artifact, never the step's
    scratch copy (issue 44: it ended FAILED naming the scratch path)."""
    import pytest

    from gradshare.contract.errors import Refusal
    from gradshare.tracking import store

    c = connection.client()
    run_id = c.create_run(c.create_experiment("corrupted-checkpoint")).info.run_id
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    c.log_artifacts(run_id, str(bad), "checkpoint")
    scratch = tmp_path / "scratch"
    commitment = {"arms": [{"arm": "powersgd", "run_id": run_id, "status": "FINISHED", "checkpoint_sha256": "0" * 64}]}
    with pytest.raises(Refusal) as refused:
        store.verified_checkpoints(commitment, scratch)
    text = str(refused.value)
    assert text.startswith(f"checkpoint of arm powersgd (run {run_id}), stored at runs:/{run_id}/checkpoint, "
                           f"cannot be read: runs:/{run_id}/checkpoint/model.safetensors is not a readable "
                           f"safetensors file"), text
    assert text.endswith("; refusing to score") and str(scratch) not in text
