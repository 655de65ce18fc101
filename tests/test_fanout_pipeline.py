"""fanout.pipeline on a distributed.LocalCluster of worker processes, as autotune uses it on a GPU host: each item's
first job (a compile: any worker) is followed at once by its second (a check-and-time: one lane worker per GPU, ahead
of the first jobs queued there, under the GPU's lock). Without a GPU: two stand-in GPUs of two workers each, the GPU
lock keyed by their names. What is checked: every result comes back, second jobs start before the last first job
ends (no stage barrier), they run on the lanes, no two of them overlap on one GPU, and a killed worker, a lane
included, loses nothing (its jobs run again elsewhere and say so)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")
dask = pytest.importorskip("dask")

from kernellab.run import fanout  # noqa: E402


@pytest.fixture(scope="module")
def four():
    """Four worker processes of one thread each: two per stand-in GPU. Work stealing off: a second job's placement on
    its lane is a loose restriction (so that a lost lane strands nothing), which Dask's stealing may override under
    load, moving it to another worker; what is checked is the pipeline's placement, and the GPU lock
    keeps timings one at a time per GPU wherever a job lands."""
    with dask.config.set({"distributed.scheduler.allowed-failures": 3,
                          "distributed.scheduler.work-stealing": False}), \
            distributed.LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            distributed.Client(c) as client:
        client.wait_for_workers(4, timeout=300)
        yield client


def compile_like(arg):
    """A first job: CPU work of some length; kills its worker once where a marker file is named and absent."""
    i, seconds, marker = arg
    if marker and not os.path.exists(marker):
        Path(marker).write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(seconds)
    return i


def time_like(arg):
    """A second job: holds its worker's GPU (the stand-in's name) while it 'times'; says where and when."""
    from distributed import get_worker

    i, gpu_of, marker = arg
    me = get_worker().address
    gpu = gpu_of.get(me, "a restarted worker's")
    with fanout.gpu_lock(f"Stand-in GPU [{gpu}]"):
        t0 = time.time()
        if marker and not os.path.exists(marker):
            Path(marker).write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.15)
        return {"i": i, "worker": me, "gpu": gpu, "span": (t0, time.time())}


def _run(client, n, gpu_of, lanes, kill_first=None, kill_second=None):
    first = [fanout.Job(compile_like, (i, 0.05 + 0.1 * (i % 3), kill_first if i == 5 else None)) for i in range(n)]
    second_of: dict[int, int] = {}

    def follow(done):
        if done.index >= n or isinstance(done.value, BaseException) or done.value % 2:
            return None                      # odd items were "pruned": no second job
        second_of[n + len(second_of)] = done.value
        return fanout.Job(time_like, (done.value, gpu_of, kill_second if done.value == 4 else None),
                          workers=lanes, priority=1)

    firsts, seconds, reruns = {}, {}, []
    last_first_end = 0.0
    for d in fanout.pipeline(client.get_executor(), first, follow):
        if d.rerun:
            reruns.append(d.rerun)
        if d.index < n:
            firsts[d.index] = d.value
            last_first_end = time.time()
        else:
            seconds[second_of[d.index]] = d.value
    return firsts, seconds, reruns, last_first_end


def _gpus(client):
    workers = sorted(client.scheduler_info()["workers"])
    gpu_of = {w: f"gpu{k // 2}" for k, w in enumerate(workers)}
    lanes = tuple(workers[0::2])                 # one per stand-in GPU
    return gpu_of, lanes


def test_second_jobs_follow_at_once_on_the_lanes_one_at_a_time_per_gpu(four):
    gpu_of, lanes = _gpus(four)
    n = 24
    firsts, seconds, reruns, last_first_end = _run(four, n, gpu_of, lanes)
    assert firsts == {i: i for i in range(n)} and sorted(seconds) == list(range(0, n, 2)) and not reruns
    assert all(s["i"] == i for i, s in seconds.items())
    assert {s["worker"] for s in seconds.values()} <= set(lanes)           # timed on the lanes only
    assert min(s["span"][0] for s in seconds.values()) < last_first_end - 0.3    # streamed, not after a barrier
    for gpu in {s["gpu"] for s in seconds.values()}:
        spans = sorted(s["span"] for s in seconds.values() if s["gpu"] == gpu)
        assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:])), (gpu, spans)   # one at a time per GPU


def test_a_killed_worker_loses_no_first_or_second_job(four, tmp_path):
    """A compile worker killed mid-job and a lane killed while it times: every item's jobs come back, those that
    ran again say so, and the second jobs still never overlap on one GPU (a lane's jobs go to the other lane, or,
    with no lane left, anywhere: the lock still holds)."""
    four.wait_for_workers(4, timeout=300)
    gpu_of, lanes = _gpus(four)
    n = 16
    firsts, seconds, reruns, _ = _run(four, n, gpu_of, lanes, kill_first=str(tmp_path / "first"),
                                      kill_second=str(tmp_path / "second"))
    assert (tmp_path / "first").exists() and (tmp_path / "second").exists()      # both kills happened
    assert firsts == {i: i for i in range(n)}, firsts
    assert sorted(seconds) == list(range(0, n, 2)) and all(isinstance(s, dict) for s in seconds.values()), seconds
    assert reruns and all("died" in r for r in reruns), reruns
    for gpu in {s["gpu"] for s in seconds.values()}:
        spans = sorted(s["span"] for s in seconds.values() if s["gpu"] == gpu)
        assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:])), (gpu, spans)


def test_pipeline_on_a_thread_pool_follows_every_first_job():
    """Any other executor: the same contract, without placement."""
    from concurrent.futures import ThreadPoolExecutor

    def follow(done):
        return fanout.Job(lambda x: -x, done.value) if done.index < 5 else None

    with ThreadPoolExecutor(3) as ex:
        got = {d.index: d.value for d in fanout.pipeline(ex, [fanout.Job(lambda x: x * x, i) for i in range(5)],
                                                          follow)}
    assert sorted(got) == list(range(10))
    assert sorted(got[i] for i in range(5)) == [0, 1, 4, 9, 16]
    assert sorted(got[i] for i in range(5, 10)) == [-16, -9, -4, -1, 0]
