"""The preflight's update bench (`gradshare.model.update_cost`) trains as an arm's update does:
one forward and backward per micro-batch of the documents it is given, then one optimizer step;
and the probe's share over two real gloo ranks is the slowest rank's update with a rank's
documents over rank 0's alone with all of them."""
from __future__ import annotations

import statistics

import torch

from gradshare.hosts import probe
from gradshare.model.update_cost import UpdateBench
from tests.two_ranks import run_two_ranks


def test_an_update_is_one_forward_a_micro_batch_and_one_optimizer_step():
    bench = UpdateBench("tiny_qwen3.json", micro_batch_docs=2, doc_tokens=16, vocab_size=64)
    assert bench.model.get_input_embeddings().weight.shape[0] == 64  # the prepared vocabulary
    forwards = []
    bench.model.register_forward_hook(lambda *a: forwards.append(1))
    before = [p.detach().clone() for p in bench.model.parameters()]
    assert bench.update_s(5) > 0
    assert len(forwards) == 3  # 5 documents in micro-batches of 2
    assert all(int(s["step"]) == 1 for s in bench.opt.state.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, bench.model.parameters()))
    assert all(p.grad is None for p in bench.model.parameters())  # zeroed for the next update


THREADS = []  # torch's threads at each timed update, in the rank's process


def _fake_update_s(rank):
    """Seconds that say what was trained: 0.05 fixed + 0.01 a document, rank 1 twice as slow."""
    def update_s(self, docs):
        THREADS.append((docs, torch.get_num_threads()))
        return (0.05 + 0.01 * docs) * (2 if rank == 1 else 1)
    return update_s


def _worker(rank, port, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        UpdateBench.update_s = _fake_update_s(rank)  # in the rank: spawned ranks see no parent's patch
        torch.set_num_threads(1)  # as the launch gives each rank
        # threads_rank 0: the ranks keep what their launch gave them, rank 0 too after its 2 alone
        p = probe.Probe(dense_buckets=[4], model="tiny_qwen3.json", vocab_size=64, docs_per_update=8,
                        micro_batch_docs=2, doc_tokens=16, threads_alone=2, threads_rank=0, compute_repeats=2)
        torch.save({"share": probe.compute_share(p, rank, 2), "threads": THREADS}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_the_probes_share_is_the_slowest_ranks_half_over_rank_0s_whole_update(tmp_path):
    zero, one = run_two_ranks(_worker, tmp_path, 2, "compute share")
    assert zero["threads"] == [(8, 2)] * 3 + [(4, 1)] * 3  # alone: a one-process arm's threads; then the launch's
    assert one["threads"] == [(4, 1)] * 3
    zero, one = zero["share"], one["share"]
    assert one == {}
    assert zero["alone_runs_s"] == [0.05 + 0.08] * 2  # rank 0 alone, all 8 documents
    assert zero["rank_runs_s"] == [2 * (0.05 + 0.04)] * 2  # 4 documents each, the slower rank's
    assert zero["alone_s"] == statistics.median(zero["alone_runs_s"])
    assert zero["share"] == zero["rank_s"] / zero["alone_s"] == (2 * 0.09) / 0.13


def test_a_local_hugging_face_model_is_timed_in_its_own_architecture(tmp_path):
    """`hf:DIR` may hold any causal LM: the bench builds that config's own class (here a Llama),
    with random weights and the prepared vocabulary."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1).save_pretrained(tmp_path)
    bench = UpdateBench(f"hf:{tmp_path}", micro_batch_docs=2, doc_tokens=8, vocab_size=96)
    assert type(bench.model).__name__ == "LlamaForCausalLM"
    assert bench.model.get_input_embeddings().weight.shape == (96, 64)
    assert bench.update_s(4) > 0
