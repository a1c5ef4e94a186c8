"""The study's three profiles, as overrides of the plan's defaults (`gradshare.contract.plan`):
`tiny` (the embedded default, a CPU laptop in minutes), `smoke` (the whole study in about two
minutes, the test suite's) and `full` (the 1.7B study on GPUs). `load_plan(profile, overrides)`
applies one, then the caller's overrides, and validates the result.
"""
from __future__ import annotations

# The full profile differs only where a 1.7B model on GPUs needs it to.
PROFILES: dict[str, dict[str, str]] = {
    "tiny": {},
    # The study's shape (four families, three arms, warm-up before compression, rank 32, global
    # normalisation) at the smallest counts that still exercise every step: 4 x 12 + 16 = 64
    # documents = 8 updates x 8, compression from update 3, a 512-token vocabulary. The whole
    # study in about two minutes on 2 cores; the test suite's small studies are this profile.
    "smoke": {
        "study.profile": "smoke",
        "data.train_per_family": "12", "data.test_per_family": "8", "data.replay_docs": "16",
        "data.retention_probes": "8", "data.pretrain_docs": "32", "schedule.updates": "8",
        "schedule.docs_per_update": "8", "schedule.micro_batch_docs": "2", "model.pretrain_steps": "12",
        "model.vocab_size": "512", "powersgd.warmup_updates": "2", "scoring.max_new_tokens": "8",
    },
    "full": {
        "study.profile": "full",
        "model.source": "random-qwen3-1.7b",
        "model.config": "qwen3_1p7b.json",
        "model.pretrain_steps": "0",
        "data.pretrain_docs": "0",
        "data.max_doc_tokens": "512",
        "optim.lr": "2e-5",
        "hardware.device": "cuda",
        "hardware.precision": "bf16-autocast",
        "hardware.deterministic": "false",
        "hardware.threads_per_process": "0",
        # An L40S update at 32 x 512 tokens plus a 6.9 GB cross-zone exchange is seconds, and
        # loading or initialising 1.7B parameters and writing 3.4 GB of weights is minutes.
        "arms.expected_update_s": "8",
        "arms.startup_s": "1200",
        "arms.expected_startup_s": "300",
        "scoring.batch_size": "128",
        # Where documents are not packed (micro_batch_tokens=0): 8 per micro-batch.
        "schedule.micro_batch_docs": "8",
        # The study's documents (median ~3,400 tokens per update: ~30-token tasks, conversations
        # up to 512) packed into rows of 512, at most 4 rows per micro-batch, each shape captured
        # as a CUDA graph: single 0.136 s/update on an H200 (0.512 s with 8 whole documents per
        # micro-batch, 0.168 s packed without graphs), 35.3 GiB reserved under the 44 GiB cap.
        # 4,096 tokens: 0.122 s but 42.1 GiB, no room for PowerSGD's arm (BENCHMARKS.md, 2026-12-04).
        "schedule.micro_batch_tokens": "2048",
        "hardware.cuda_graphs": "true",
        "hardware.max_device_gib": "44",
        # Speed levers measured in benchmarks/gpu_path.py (BENCHMARKS.md); each computes the
        # same function as the plain path, so the tiny profile keeps the plain one.
        # CholeskyQR2 and 2 GB of error staging measured slower than QR and 512 MB (2026-12-04).
        "hardware.compile": "true",
        "hardware.fused_adamw": "true",
        "hardware.gradient_as_bucket_view": "true",
        "hardware.loss_chunk_tokens": "2048",
        "powersgd.hook": "fast",
        "powersgd.bucket_cap_mb": "200",
        "powersgd.staging_mb": "512",
    },
}
