"""Training from Python: train() against the CLI, and a loop written here with the pieces
(MLP, fully_shard, cross_entropy, an optimizer) that reproduces the CLI's weights bit for bit."""

import json
import re

import numpy as np
import pytest

import meshtensor as mt
from conftest import chunk

RUN = dict(model="mlp:32,16", steps=6, batch=500, seed=3, lr=2e-3)


def cli_digest(cli, data_dir, ranks, **options):
    args = ["train", "--data", data_dir, "--ranks", ranks]
    for key, value in {**RUN, **options}.items():
        args += [f"--{key.replace('_', '-')}", value]
    return re.search(r"weights digest ([0-9a-f]{16})", cli(*args)).group(1)


@pytest.mark.parametrize("ranks,options", [
    (4, dict(strategy="fsdp", mode="exact")),
    (4, dict(strategy="hsdp", replicas=2, mode="ordered", micro_batches=2)),
    (3, dict(strategy="ddp", mode="ordered", optimizer="sgd")),
])
def test_train_equals_the_cli(cli, data_dir, ranks, options):
    data = mt.load_dataset(data_dir)
    results = mt.run_threads(ranks, lambda world: mt.train(data, **RUN, **options))
    assert len({r["digest"] for r in results}) == 1 and results[0]["replicas_identical"]
    cli_options = dict(options)
    if "replicas" in cli_options:
        cli_options["mesh"] = f"{cli_options.pop('replicas')}x{ranks // 2}"
    assert results[0]["digest"] == cli_digest(cli, data_dir, ranks, **cli_options)
    assert results[0]["steps"] == 6 and 0 < results[0]["test_accuracy"] <= 1


def python_loop(data, mesh_shape, micro_batches, mode, strategy="fsdp"):
    """The trainer's steps, written with the Python pieces."""
    images = data.train_images.reshape(len(data.train_labels), -1)
    labels = data.train_labels
    samples, batch, steps = len(labels), RUN["batch"], RUN["steps"]

    def body(world):
        mesh = mt.init_device_mesh("cpu", mesh_shape)
        model = mt.MLP(images.shape[1], [32, 16], 10, seed=RUN["seed"])
        if strategy == "ddp":
            mt.replicate(model, mesh, mode=mode)
        else:
            mt.fully_shard(model, mesh, mode=mode)
        optimizer = mt.AdamW(model, lr=RUN["lr"])
        order = mt.epoch_order(samples, RUN["seed"], 0)
        for step in range(steps):
            start = step * batch
            global_batch = min(batch, samples - start)
            offset, size = chunk(global_batch, world.size, world.rank)
            model.zero_grad()
            model.set_gradient_divide_factor(global_batch)
            for k in range(micro_batches):
                last = k + 1 == micro_batches
                model.set_is_last_backward(last)
                model.set_requires_gradient_sync(last)
                m_offset, m_size = chunk(size, micro_batches, k)
                rows = order[start + offset + m_offset:start + offset + m_offset + m_size]
                x = images[rows].astype(np.float32) / np.float32(255)
                logits = model(x)
                losses, grad, correct = mt.cross_entropy(logits, labels[rows])
                model.backward(grad)
            optimizer.step(mt.lr_at(step, RUN["lr"], steps))
        return model.digest(), model.full_parameters()

    return mt.run_threads(int(np.prod(mesh_shape)), body)


def test_a_python_training_loop_reproduces_the_cli(cli, data_dir):
    data = mt.load_dataset(data_dir)
    fsdp = python_loop(data, (4,), 1, "exact")
    hsdp = python_loop(data, (2, 2), 2, "exact")
    ddp = python_loop(data, (3,), 3, "exact", strategy="ddp")
    digests = {d for d, _ in fsdp + hsdp + ddp}
    assert digests == {cli_digest(cli, data_dir, 4, strategy="fsdp", mode="exact")}
    # The weights as NumPy: the same on every rank, and their digest is the model's.
    params = fsdp[0][1]
    assert list(params)[:2] == ["0.weight", "0.bias"] and params["0.weight"].shape == (784, 32)
    for _, other in fsdp[1:] + hsdp:
        assert all(np.array_equal(params[k], other[k]) for k in params)


def test_ordered_loop_equals_the_cli_on_the_same_layout(cli, data_dir):
    data = mt.load_dataset(data_dir)
    digests = {d for d, _ in python_loop(data, (2, 2), 1, "ordered")}
    assert digests == {cli_digest(cli, data_dir, 4, strategy="hsdp", mesh="2x2", mode="ordered")}


def test_model_checkpoints_load_onto_another_layout(tmp_path, data_dir):
    data = mt.load_dataset(data_dir)
    x = data.train_images[:64].reshape(64, -1).astype(np.float32) / np.float32(255)
    y = data.train_labels[:64]

    def step(model, optimizer):
        model.zero_grad()
        model.set_gradient_divide_factor(64)
        offset, size = chunk(64, mt.get_world_size(), mt.get_rank())
        _, grad, _ = mt.cross_entropy(model(x[offset:offset + size]), y[offset:offset + size])
        model.backward(grad)
        optimizer.step()

    def first(world):
        model = mt.fully_shard(mt.MLP(784, [24], 10, seed=1), mt.init_device_mesh("cpu", (4,)),
                               mode="exact")
        optimizer = mt.AdamW(model, lr=1e-2)
        step(model, optimizer)
        path = model.save(str(tmp_path), step=1, optimizer=optimizer)
        step(model, optimizer)
        return path, model.digest()

    def resumed(world):
        model = mt.fully_shard(mt.MLP(784, [24], 10, seed=99), mt.init_device_mesh("cpu", (1, 3)),
                               mode="exact")
        optimizer = mt.AdamW(model, lr=1e-2)
        model.load(str(tmp_path), optimizer=optimizer)
        step(model, optimizer)
        return model.digest()

    path, straight = mt.run_threads(4, first)[0]
    assert path.endswith("step-00000001")
    assert set(mt.run_threads(3, resumed)) == {straight}

    def wrong_shape(world):
        model = mt.fully_shard(mt.MLP(784, [25], 10), mt.init_device_mesh("cpu", (1,)))
        model.load(str(tmp_path))

    with pytest.raises(mt.DataError, match="0.weight"):
        mt.run_threads(1, wrong_shape)


def test_dataset_arrays_view_the_loaded_data(data_dir):
    data = mt.load_dataset(data_dir)
    assert data.train_images.shape == (3000, 28, 28) and data.train_images.dtype == np.uint8
    assert data.test_labels.shape == (500,) and data.test_labels.max() < 10
    assert not data.train_images.flags.writeable
    small = data.limit(100, 10)
    assert small.train_images.shape == (100, 28, 28)
    assert np.array_equal(small.train_images, data.train_images[:100])
    with pytest.raises(mt.DataError, match="no-such-dir"):
        mt.load_dataset("/no-such-dir")


def test_training_errors_name_the_value(data_dir):
    data = mt.load_dataset(data_dir)
    with pytest.raises(mt.InvalidArgument, match="unknown option 'epoch'"):
        mt.run_threads(1, lambda w: mt.train(data, epoch=2))
    with pytest.raises(mt.ParseError, match="'sdg'"):
        mt.run_threads(1, lambda w: mt.train(data, optimizer="sdg"))
    # The command line's settings path (train::TrainSettings): the same ranges and messages,
    # each refused by its keyword before any training.
    for options, message in [(dict(momentum=2), "momentum 2 is outside \\[0, 1\\]"),
                             (dict(epochs=0), "epochs and steps exclude each other"),
                             (dict(warmup=-1), "warmup: '-1' is not a non-negative integer"),
                             (dict(replicas=-1), "replicas: '-1' is not a non-negative"),
                             (dict(lr=float("nan")), "lr 'nan' is not a number"),
                             (dict(prefetch=65), "prefetch: '65' is too large \\(at most 64\\)"),
                             (dict(sequence_parallel="maybe"), "'maybe' is not true or false")]:
        with pytest.raises(mt.ParseError, match=message):
            mt.run_threads(1, lambda w: mt.train(data, steps=1, **options))
    with pytest.raises(mt.ParseError, match="epochs: '0' is too small"):
        mt.run_threads(1, lambda w: mt.train(data, epochs=0))
    with pytest.raises(mt.InvalidArgument, match="600 micro-batches"):
        mt.run_threads(1, lambda w: mt.train(data, steps=1, micro_batches=600, batch=500))
    with pytest.raises(mt.InvalidArgument, match="fully_shard"):
        mt.MLP(4, [3], 2).forward(np.zeros((1, 4), np.float32))


GPT_RUN = dict(model="gpt:layers=1,heads=2,dim=16,context=16", steps=3, batch=6, seed=2, lr=3e-3,
               warmup=1)


def test_a_python_gpt_loop_reproduces_the_cli(cli, text):
    corpus = mt.load_text(text)
    context, batch, steps, seed, lr = 16, GPT_RUN["batch"], GPT_RUN["steps"], GPT_RUN["seed"], GPT_RUN["lr"]
    assert corpus.records == 80 and len(corpus.validation) > 0

    def body(world):
        mesh = mt.init_device_mesh("cpu", (world.size,))
        model = mt.GPT(layers=1, heads=2, dim=16, context=context, seed=seed)
        mt.fully_shard(model, mesh, mode="exact")
        optimizer = mt.AdamW(model, lr=lr)
        for step in range(steps):
            offset, size = chunk(batch, world.size, world.rank)
            tokens, targets = corpus.windows(context, seed, 0, step * batch + offset, size)
            model.zero_grad()
            model.set_gradient_divide_factor(batch * context)
            logits = model(tokens)
            assert logits.shape == (size, context, 256)
            _, grad, _ = mt.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1),
                                          exact_sums=True)
            model.backward(grad.reshape(logits.shape))
            optimizer.step(mt.lr_at(step, lr, steps, warmup=GPT_RUN["warmup"]))
        return model.digest()

    loop = set(mt.run_threads(2, body)) | set(mt.run_threads(3, body))
    trained = mt.run_threads(2, lambda world: mt.train(corpus, **GPT_RUN, mode="exact",
                                                       strategy="fsdp", eval_every=0))
    assert trained[0]["sample"] and trained[0]["validation_loss"] > 0
    cli_run = cli("train", "--data", text, "--ranks", 4, "--strategy", "ddp", "--mode", "exact",
                  *[a for k, v in GPT_RUN.items() for a in (f"--{k}", v)])
    assert loop == {trained[0]["digest"]} == {re.search(r"weights digest ([0-9a-f]{16})",
                                                        cli_run).group(1)}


def test_tensor_parallel_training_ends_on_the_fsdp_digest_in_exact_mode(text):
    corpus = mt.load_text(text)
    run = dict(GPT_RUN, model="gpt:layers=1,heads=4,dim=16,context=16", mode="exact",
               eval_every=0)
    fsdp = mt.run_threads(4, lambda world: mt.train(corpus, **run, mesh=(4,), names=("fsdp",)))
    tp = mt.run_threads(4, lambda world: mt.train(corpus, **run, mesh=(2, 2), names=("fsdp", "tp"),
                                                  sequence_parallel=True, clip_grad_norm=0.5))
    clipped = mt.run_threads(2, lambda world: mt.train(corpus, **run, mesh="2", names="tp",
                                                       clip_grad_norm=0.5))
    assert fsdp[0]["digest"] != tp[0]["digest"]  # clipping changes the weights
    assert {r["digest"] for r in tp} == {clipped[0]["digest"]}
    assert {r["logits_digest"] for r in tp} == {clipped[0]["logits_digest"]}
    plan = dict(tp[0]["parallel_plan"])
    assert plan["blocks.0.attn.proj"].endswith("matmul nn S2 x S0 -> P(sum)")
    assert "reduce_scatter" in tp[0]["parallel_log"]
    with pytest.raises(mt.InvalidArgument, match="does not divide the model's 4 heads"):
        mt.run_threads(3, lambda world: mt.train(corpus, **run, mesh=(3,), names=("tp",)))
    # A mesh without dim names is hsdp's replicas x shards, as on the command line.
    with pytest.raises(mt.ParseError, match="mesh '1' is not RxS"):
        mt.train(corpus, **run, mesh=(1,))


def test_pipeline_training_ends_on_the_one_rank_digest_in_exact_mode(text):
    corpus = mt.load_text(text)
    run = dict(GPT_RUN, model="gpt:layers=4,heads=2,dim=16,context=16", mode="exact",
               eval_every=0, clip_grad_norm=0.5)
    one = mt.run_threads(1, lambda world: mt.train(corpus, **run))[0]
    piped = mt.run_threads(4, lambda world: mt.train(
        corpus, **run, mesh=(2, 2), names=("pp", "tp"), micro_batches=4,
        pipeline_schedule="interleaved-1f1b", virtual_stages=2,
        activation_checkpointing="full"))
    assert {r["digest"] for r in piped} == {one["digest"]}
    assert piped[0]["pipeline"]["stage_units"] == ["embed, blocks.0", "blocks.1", "blocks.2",
                                          "blocks.3, head"]
    # The library names the setting; Python gives it as its keyword (the CLI as --micro-batches).
    with pytest.raises(mt.InvalidArgument, match=r"1 micro-batches is fewer than the 2 pp ranks "
                       r"\(give micro_batches 2 or more"):
        mt.run_threads(2, lambda world: mt.train(corpus, **run, mesh=(2,), names=("pp",),
                                                 micro_batches=1))
    # The command line's default: two micro-batches per pp rank (at most the batch).
    default = mt.run_threads(2, lambda world: mt.train(corpus, **run, mesh=(2,), names=("pp",)))
    assert default[0]["pipeline"]["micro_batches"] == 4
    assert default[0]["digest"] == one["digest"]
    with pytest.raises(mt.ParseError, match="unknown activation checkpointing 'all'"):
        mt.run_threads(1, lambda world: mt.train(corpus, **run, activation_checkpointing="all"))
    with pytest.raises(mt.ParseError, match="virtual_stages: .0. is too small \\(at least 1\\)"):
        mt.run_threads(2, lambda world: mt.train(corpus, **run, mesh=(2,), names=("pp",),
                                                 micro_batches=2, virtual_stages=0,
                                                 pipeline_schedule="interleaved-1f1b"))


def test_context_parallel_training_ends_on_the_one_rank_digest_in_exact_mode(text):
    corpus = mt.load_text(text)
    run = dict(GPT_RUN, model="gpt:layers=2,heads=2,dim=16,context=22", mode="exact",
               eval_every=0)
    one = mt.run_threads(1, lambda world: mt.train(corpus, **run))[0]
    # 22 positions over cp 3: 6 chunks of 4 and a last of 2 (uneven), times tp 2 with SP.
    split = mt.run_threads(6, lambda world: mt.train(
        corpus, **run, mesh=(3, 2), names=("cp", "tp"), sequence_parallel=True))
    assert {(r["digest"], r["logits_digest"]) for r in split} == {
        (one["digest"], one["logits_digest"])}
    assert split[0]["mesh"] == "1x1x3x2 (dp x fsdp x cp x tp)"
    with pytest.raises(mt.InvalidArgument, match=r"context of 22 positions does not split over "
                       r"cp 8 .* cp degrees that split it: 2, 3, 4, 11"):
        mt.run_threads(8, lambda world: mt.train(corpus, **run, mesh=(8,), names=("cp",)))


def test_the_step_profile_adds_up_to_the_step_time_and_mfu_is_a_fraction(text):
    corpus = mt.load_text(text)
    for mode in ("ordered", "exact"):
        result = mt.run_threads(1, lambda world: mt.train(
            corpus, **dict(GPT_RUN, steps=6, eval_every=0, mode=mode)))[0]
        profile = result["profile"]
        rows = profile["seconds_per_step"]
        assert set(rows) == {"other", "matmul", "attention", "exact_sums", "norms_activations",
                             "loss", "optimizer", "communication_wait", "data"}
        assert profile["steps"] == 4  # every step after the first two
        assert abs(sum(rows.values()) - profile["step_seconds"]) <= 0.05 * profile["step_seconds"]
        assert rows["matmul"] > 0 and rows["attention"] > 0
        # Exact mode's gradients are binned sums; ordered mode bins only the loss total.
        assert (rows["exact_sums"] > 0.1 * profile["step_seconds"]) == (mode == "exact")
        assert 0 < result["mfu"] < 1.5
        assert result["model_flops_per_second"] > 0 and result["peak_flops_per_second"] > 0


def test_generate_matches_the_cli_and_does_not_depend_on_the_batch(cli, text, tmp_path):
    corpus = mt.load_text(text)
    save = str(tmp_path / "ckpt")
    run = dict(GPT_RUN, model="gpt:layers=1,heads=4,dim=16,context=16", mode="exact",
               eval_every=0, save=save)
    mt.run_threads(4, lambda world: mt.train(corpus, **run, mesh=(2, 2), names=("fsdp", "tp")))
    options = dict(max_new_tokens=6, temperature=0.9, top_k=10, seed=3, mode="exact")

    def body(world):
        alone = mt.generate(save, "fortune", **options)
        batched = mt.generate(save, ["x", "fortune", [1, 2, 3]], **options, max_batch=2,
                              prefill_chunk=2)
        return alone[0], batched[1]

    for alone, batched in mt.run_threads(2, body):
        assert alone == batched and len(alone["tokens"]) == 6
    shown = json.loads(cli("generate", "--checkpoint", save, "--prompt", "fortune", "--json",
                           *[a for k, v in options.items()
                             for a in (f"--{k.replace('_', '-')}", v)]))
    assert shown["tokens"] == alone["tokens"] and shown["logprobs"] == alone["logprobs"]
    with pytest.raises(mt.InvalidArgument, match="prompt is empty"):
        mt.run_threads(1, lambda world: mt.generate(save, [""], **options))


def test_gpt_training_errors_name_the_value(text, data_dir):
    corpus = mt.load_text(text)
    with pytest.raises(mt.InvalidArgument, match="context=4096"):
        mt.train(corpus, model="gpt:context=4096", steps=1)
    with pytest.raises(mt.InvalidArgument, match="trains on images"):
        mt.train(corpus, model="mlp:8")
    with pytest.raises(mt.InvalidArgument, match="trains on text"):
        mt.train(mt.load_dataset(data_dir), model="gpt")
    with pytest.raises(mt.DataError, match="not UTF-8"):
        mt.load_text("/bin/sh")


def test_replica_groups_end_on_the_one_job_digest(cli, data_dir):
    """Two replica groups of a fault-tolerant run, each its own world, with a coordinator."""
    import subprocess
    import threading

    coordinator = subprocess.Popen([cli.binary, "coordinator", "--host", "127.0.0.1", "--port", "0"],
                                   stdout=subprocess.PIPE, text=True)
    try:
        port = re.search(r"127\.0\.0\.1:(\d+)", coordinator.stdout.readline()).group(1)
        data = mt.load_dataset(data_dir)
        options = dict(RUN, mode="exact")
        one = mt.run_threads(1, lambda world: mt.train(data, **options))[0]["digest"]
        results = {}

        def group(index):
            results[index] = mt.run_threads(2, lambda world: mt.train(
                data, **options, replica_groups=2, replica_group=index,
                coordinator=f"127.0.0.1:{port}"))
        threads = [threading.Thread(target=group, args=(g,)) for g in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        digests = {r["digest"] for g in (0, 1) for r in results[g]}
        assert digests == {one}
        with pytest.raises(mt.InvalidArgument, match="replica group 2 is not one of the run's 2"):
            mt.train(data, **options, replica_groups=2, replica_group=2,
                     coordinator=f"127.0.0.1:{port}")
    finally:
        coordinator.terminate()
        coordinator.wait()
