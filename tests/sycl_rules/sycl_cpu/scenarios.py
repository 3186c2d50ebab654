"""The rules of SYCL graph recording that inductor_xpugraph relies on, as runnable scenarios.

Each ``scenario_*`` function takes a runtime ``rt`` of the shared API (the real SYCL runtime of
real_runtime.py, or the stand-in ``inductor_xpugraph.sycl_rules.sycl``) and returns its
observations: a JSON-able list of ``[label, value]`` pairs, where a call's value is "ok" or
"SyclError: <SYCL's exception text>". Both runtimes must give the same lists
(tests/sycl_rules/test_sycl_rules_differential.py).

Only the shared API is used here. Counter values are read only where nothing that touches the
counter can still be running (after a wait, or where the work never ran), so that the real
runtime's observations do not depend on timing.
"""

from __future__ import annotations


class Observations(list):
    """The ``[label, value]`` list a scenario returns."""

    def note(self, label: str, value) -> None:
        self.append([label, value])

    def call(self, label: str, function, *args, **kwargs):
        """Calls ``function``; notes "ok" or the SyclError's text; returns its result or None."""
        try:
            result = function(*args, **kwargs)
        except RuntimeError as error:
            if type(error).__name__ != "SyclError":
                raise
            self.note(label, f"SyclError: {error}")
            return None
        self.note(label, "ok")
        return result


def scenario_wait_on_recording_queue(rt):
    """queue.wait() throws while the queue records; another, unrelated queue still waits."""
    seen = Observations()
    queue, other, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(queue)
    seen.note("state before recording", queue.state)
    seen.call("begin_recording", graph.begin_recording, queue)
    seen.note("state while recording", queue.state)
    seen.call("submit on the recording queue", queue.submit, counter.increment)
    seen.call("wait on the recording queue", queue.wait)
    seen.call("submit on the other queue", other.submit, counter.increment)
    seen.call("wait on the other queue", other.wait)
    seen.note("counter after the other queue's wait", counter.value)
    seen.call("end_recording", graph.end_recording, queue)
    seen.note("state after end_recording", queue.state)
    seen.call("wait after end_recording", queue.wait)
    seen.note("counter", counter.value)
    return seen


def scenario_recorded_kernel_depends_on_eager_event(rt):
    """A recorded kernel may not depend on an event of an eager submission, complete or not."""
    seen = Observations()
    queue, other, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    completed = queue.submit(counter.increment)
    completed.wait()
    seen.note("eager event complete after its wait", completed.complete)
    not_waited = queue.submit(counter.increment)  # possibly still running
    on_other_queue = other.submit(counter.increment)
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    seen.call(
        "record depending on a completed eager event",
        queue.submit,
        counter.increment,
        depends_on=[completed],
    )
    seen.call(
        "record depending on an eager event not waited on",
        queue.submit,
        counter.increment,
        depends_on=[not_waited],
    )
    seen.call(
        "record depending on an eager event of another queue",
        queue.submit,
        counter.increment,
        depends_on=[on_other_queue],
    )
    seen.call("record a barrier over a completed eager event", queue.submit_barrier, [completed])
    seen.note("state after the failed submissions", queue.state)
    graph.end_recording()
    seen.call("wait", queue.wait)
    seen.call("wait on the other queue", other.wait)
    seen.note("counter after the eager work", counter.value)
    exec_graph = graph.finalize()
    seen.call("submit the graph", queue.submit_graph, exec_graph)
    seen.call("wait", queue.wait)
    seen.note("counter after the graph (the failed submissions recorded nothing)", counter.value)
    return seen


def scenario_graph_replays_on_submission(rt):
    """Recorded work runs only when the executable graph is submitted, once per submission."""
    seen = Observations()
    queue, counter = rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    queue.submit(counter.increment)
    graph.end_recording(queue)
    seen.note("counter after end_recording", counter.value)
    exec_graph = seen.call("finalize", graph.finalize)
    seen.note("counter after finalize", counter.value)
    first = seen.call("submit the graph", queue.submit_graph, exec_graph)
    seen.call("wait on the graph's event", first.wait)
    seen.note("graph event complete", first.complete)
    seen.note("counter after one submission", counter.value)
    seen.call("submit the graph again", queue.submit_graph, exec_graph)
    seen.call("wait", queue.wait)
    seen.note("counter after two submissions", counter.value)
    return seen


def scenario_begin_recording_on_recording_queue(rt):
    """begin_recording throws for a queue that already records, into the same graph or not."""
    seen = Observations()
    queue = rt.new_queue()
    graph, second = rt.new_graph(queue), rt.new_graph(queue)
    seen.call("begin_recording", graph.begin_recording, queue)
    seen.call("begin_recording again, same graph", graph.begin_recording, queue)
    seen.call("begin_recording into another graph", second.begin_recording, queue)
    seen.note("state", queue.state)
    seen.call("end_recording", graph.end_recording, queue)
    seen.note("state after end_recording", queue.state)
    seen.call("begin_recording into the other graph", second.begin_recording, queue)
    seen.note("state", queue.state)
    seen.call("end_recording of the other graph", second.end_recording)
    return seen


def scenario_end_recording_variants(rt):
    """end_recording(queue) and end_recording() on queues recording elsewhere or not at all."""
    seen = Observations()
    queue, idle = rt.new_queue(), rt.new_queue()
    graph, other_graph = rt.new_graph(queue), rt.new_graph(queue)
    graph.begin_recording(queue)
    seen.call(
        "end_recording(queue) of a graph the queue does not record to",
        other_graph.end_recording,
        queue,
    )
    seen.note("state after it", queue.state)
    seen.call("end_recording() of a graph no queue records to", other_graph.end_recording)
    seen.call("end_recording(queue) for a queue that does not record", graph.end_recording, idle)
    seen.note("state of that queue", idle.state)
    seen.note("state of the recording queue", queue.state)
    seen.call("end_recording(queue)", graph.end_recording, queue)
    seen.note("state after end_recording(queue)", queue.state)
    seen.call("end_recording(queue) again", graph.end_recording, queue)
    seen.call("end_recording() after it", graph.end_recording)
    seen.call("begin_recording again", graph.begin_recording, queue)
    seen.call("end_recording()", graph.end_recording)
    seen.note("state after end_recording()", queue.state)
    seen.call("end_recording() again", graph.end_recording)
    return seen


def scenario_release_recording_graph(rt):
    """Destroying the last handle of a graph a queue records into returns the queue to
    executing; the kernels recorded never run; the queue can record a new graph."""
    seen = Observations()
    queue, counter = rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    seen.call("record a kernel", queue.submit, counter.increment)
    seen.note("state while recording", queue.state)
    graph.release()
    seen.note("state after the graph's last handle is destroyed", queue.state)
    seen.call("wait", queue.wait)
    seen.note("counter (the recorded kernel did not run)", counter.value)
    seen.call("eager submit", queue.submit, counter.increment)
    seen.call("wait", queue.wait)
    seen.note("counter after an eager kernel", counter.value)
    replacement = rt.new_graph(queue)
    seen.call("begin_recording into a new graph", replacement.begin_recording, queue)
    seen.note("state", queue.state)
    queue.submit(counter.increment)
    seen.call("end_recording", replacement.end_recording)
    exec_graph = replacement.finalize()
    queue.submit_graph(exec_graph)
    seen.call("wait", queue.wait)
    seen.note("counter after the new graph ran", counter.value)
    return seen


def _joined_queue(rt, join, end):
    """Queue B joins queue A's recording through ``join(B, recorded event of A, counter)``;
    then ``end(graph, A)`` ends A's recording."""
    seen = Observations()
    a, b, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(a)
    graph.begin_recording(a)
    recorded = a.submit(counter.increment)
    seen.note("B's state before", b.state)
    joined = seen.call("B submits with A's recorded event", join, b, recorded, counter)
    seen.note("B's state after", b.state)
    seen.call("B.wait()", b.wait)
    if joined is not None:
        seen.call("wait on B's event", joined.wait)
        seen.note("B's event complete", joined.complete)
    seen.note("counter (nothing ran)", counter.value)
    seen.call("end A's recording", end, graph, a)
    seen.note("A's state", a.state)
    seen.note("B's state", b.state)
    seen.call("B.wait()", b.wait)
    seen.call("B submits a kernel", b.submit, counter.increment)
    seen.note("B's state", b.state)
    seen.call("the graph's end_recording()", graph.end_recording)
    seen.note("B's state after the graph's end_recording()", b.state)
    seen.call("B.wait()", b.wait)
    seen.note("counter before the graph runs", counter.value)
    exec_graph = seen.call("finalize", graph.finalize)
    if exec_graph is not None:
        seen.call("submit the graph", a.submit_graph, exec_graph)
        seen.call("wait", a.wait)
        seen.note("counter after the graph ran", counter.value)
    return seen


def _kernel_after(queue, event, counter):
    return queue.submit(counter.increment, depends_on=[event])


def _barrier_over(queue, event, counter):
    return queue.submit_barrier([event])


def scenario_joined_by_kernel_then_end_recording_all(rt):
    """B submits a kernel depending on a recorded event of A; the graph's end_recording()."""
    return _joined_queue(rt, _kernel_after, lambda graph, a: graph.end_recording())


def scenario_joined_by_kernel_then_end_recording_a(rt):
    """B submits a kernel depending on a recorded event of A; the graph's end_recording(A)."""
    return _joined_queue(rt, _kernel_after, lambda graph, a: graph.end_recording(a))


def scenario_joined_by_barrier_then_end_recording_a(rt):
    """B submits a barrier over a recorded event of A; the graph's end_recording(A)."""
    return _joined_queue(rt, _barrier_over, lambda graph, a: graph.end_recording(a))


def scenario_release_graph_with_joined_queue(rt):
    """Destroying the graph's last handle returns a joined queue to executing as well."""
    seen = Observations()
    a, b, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(a)
    graph.begin_recording(a)
    recorded = a.submit(counter.increment)
    b.submit(counter.increment, depends_on=[recorded])
    seen.note("B's state after joining", b.state)
    graph.release()
    seen.note("A's state after the release", a.state)
    seen.note("B's state after the release", b.state)
    seen.call("B.wait()", b.wait)
    seen.call("B submits a kernel", b.submit, counter.increment)
    seen.call("B.wait()", b.wait)
    seen.note("counter (only the last kernel ran)", counter.value)
    return seen


def scenario_wait_on_recorded_event(rt):
    """event.wait() throws for a recorded node's event; such events report complete."""
    seen = Observations()
    queue, counter = rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    recorded = queue.submit(counter.increment)
    seen.call("wait on a recorded kernel's event", recorded.wait)
    seen.note("recorded kernel's event complete", recorded.complete)
    barrier = queue.submit_barrier([recorded])
    seen.call("wait on a recorded barrier's event", barrier.wait)
    seen.note("recorded barrier's event complete", barrier.complete)
    graph.end_recording()
    seen.call("wait on the kernel's event after end_recording", recorded.wait)
    seen.note("counter (nothing ran)", counter.value)
    queue.submit_graph(graph.finalize())
    queue.wait()
    seen.call("wait on the kernel's event after the graph ran", recorded.wait)
    seen.note("counter after the graph ran", counter.value)
    return seen


def scenario_blocking_copy_on_recording_queue(rt):
    """A blocking copy on a recording queue (a copy, then a host wait on it: what torch's
    blocking device-to-host copy and ``.item()`` do) throws at the wait, yet the copy is a node
    of the graph: it copies nothing now, and once at each replay."""
    seen = Observations()
    queue, source, target = rt.new_queue(), rt.new_counter(), rt.new_counter()
    queue.submit(source.increment).wait()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    copied = seen.call("copy on the recording queue", queue.memcpy, target, source)
    seen.call("wait on the copy's event", copied.wait)
    seen.call("wait on the recording queue", queue.wait)
    seen.note("target before the graph ran (nothing copied)", target.value)
    graph.end_recording(queue)
    executable = graph.finalize()
    queue.submit(source.increment)
    queue.submit_graph(executable)
    queue.wait()
    seen.note("target after the graph ran (copied at replay)", target.value)
    return seen


def _submit_after_recorded(rt, seen, before):
    """Records a kernel on A, runs ``before(graph, A)``, then makes eager submissions that
    depend on the recorded kernel's event: a kernel on B (an executing queue that records no
    graph), a kernel on A, a barrier on B. Returns (graph, A, counter)."""
    a, b, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(a)
    graph.begin_recording(a)
    recorded = a.submit(counter.increment)
    before(graph, a)
    seen.note("A's state", a.state)
    seen.note("B's state", b.state)
    seen.call(
        "B submits a kernel depending on the recorded event",
        b.submit,
        counter.increment,
        depends_on=[recorded],
    )
    seen.note("B's state", b.state)
    seen.call("B.wait()", b.wait)
    seen.note("counter", counter.value)
    seen.call(
        "A submits a kernel depending on the recorded event",
        a.submit,
        counter.increment,
        depends_on=[recorded],
    )
    seen.note("A's state", a.state)
    seen.call("A.wait()", a.wait)
    seen.note("counter", counter.value)
    seen.call("B submits a barrier over the recorded event", b.submit_barrier, [recorded])
    seen.note("B's state", b.state)
    seen.call("B.wait()", b.wait)
    return graph, a, counter


def _run_recorded_graph(seen, graph, a, counter):
    """Ends every recording into ``graph``, finalizes it and runs it once on A."""
    seen.call("the graph's end_recording()", graph.end_recording)
    seen.note("A's state", a.state)
    seen.note("counter before the graph runs", counter.value)
    a.submit_graph(graph.finalize())
    a.wait()
    seen.note("counter after the graph ran", counter.value)


def scenario_eager_depends_on_recorded_event_while_recording(rt):
    """(a) Executing queues submit with a dependency on a node of a graph that A records."""
    seen = Observations()
    graph, a, counter = _submit_after_recorded(rt, seen, lambda graph, a: None)
    _run_recorded_graph(seen, graph, a, counter)
    return seen


def scenario_eager_depends_on_recorded_event_after_end_recording(rt):
    """(b) ... after the graph's end_recording(): the graph is no longer recorded into."""
    seen = Observations()
    graph, a, counter = _submit_after_recorded(rt, seen, lambda graph, a: graph.end_recording())
    _run_recorded_graph(seen, graph, a, counter)
    return seen


def scenario_eager_depends_on_recorded_event_after_finalize(rt):
    """(b') ... after end_recording() and finalize(); then the earlier executable graph and a
    new one run."""
    seen = Observations()
    finalized = []
    graph, a, counter = _submit_after_recorded(
        rt, seen, lambda graph, a: (graph.end_recording(), finalized.append(graph.finalize()))
    )
    seen.call("the graph's end_recording()", graph.end_recording)
    seen.call("submit the executable graph finalized before", a.submit_graph, finalized[0])
    seen.call("A.wait()", a.wait)
    seen.note("counter after it ran", counter.value)
    a.submit_graph(graph.finalize())
    a.wait()
    seen.note("counter after a graph finalized now ran", counter.value)
    return seen


def scenario_eager_depends_on_recorded_event_after_release(rt):
    """(c) ... after the last handle of the (still recording) graph was destroyed."""
    seen = Observations()
    _submit_after_recorded(rt, seen, lambda graph, a: graph.release())
    return seen


def scenario_barrier_without_events_on_recording_queue(rt):
    """A barrier with no event list on a recording queue, and a wait on its event."""
    seen = Observations()
    queue, counter = rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    first = seen.call("barrier as the graph's first command", queue.submit_barrier)
    if first is not None:
        seen.call("wait on its event", first.wait)
        seen.note("its event complete", first.complete)
    queue.submit(counter.increment)
    barrier = seen.call("barrier after a kernel", queue.submit_barrier)
    if barrier is not None:
        seen.call("wait on its event", barrier.wait)
        seen.note("its event complete", barrier.complete)
    seen.note("state", queue.state)
    graph.end_recording()
    seen.note("counter (nothing ran)", counter.value)
    exec_graph = seen.call("finalize", graph.finalize)
    if exec_graph is not None:
        seen.call("submit the graph", queue.submit_graph, exec_graph)
        seen.call("wait", queue.wait)
        seen.note("counter after the graph ran", counter.value)
    return seen


def scenario_device_wait(rt):
    """sycl::device::ext_oneapi_wait() on this device, idle and while a queue records."""
    seen = Observations()
    seen.call("device_wait", rt.device_wait)
    queue = rt.new_queue()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    seen.call("device_wait while a queue records", rt.device_wait)
    graph.end_recording()
    return seen


def scenario_executable_graph_keeps_its_recording_joinable(rt):
    """torch keeps only the executable graph after a capture (the modifiable one is destroyed).
    A queue that then submits with a dependency on an event recorded during the capture joins
    the graph's recording for as long as the executable graph lives: its work never runs.
    Once the executable graph is destroyed too, the queue executes again."""
    seen = Observations()
    a, b, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(a)
    graph.begin_recording(a)
    recorded = a.submit(counter.increment)
    graph.end_recording()
    exec_graph = graph.finalize()
    graph.release()
    seen.note("A's state after the modifiable graph is destroyed", a.state)
    seen.call(
        "B submits a kernel depending on the recorded event",
        b.submit,
        counter.increment,
        depends_on=[recorded],
    )
    seen.note("B's state while the executable graph lives", b.state)
    seen.call("B.wait()", b.wait)
    seen.call("submit the executable graph on A", a.submit_graph, exec_graph)
    seen.call("A.wait()", a.wait)
    seen.note("counter (the graph ran; B's kernel did not)", counter.value)
    exec_graph.release()
    seen.note("B's state after the executable graph is destroyed", b.state)
    seen.call("B.wait()", b.wait)
    seen.call("B submits a kernel", b.submit, counter.increment)
    seen.call("B.wait()", b.wait)
    seen.note("counter (B's new kernel ran)", counter.value)
    return seen


def scenario_wait_on_event_of_graph_destroyed_while_recording(rt):
    """event.wait() on a node's event returns once the graph is gone: destroyed while its queue
    still recorded, with no executable graph."""
    seen = Observations()
    queue, counter = rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    recorded = queue.submit(counter.increment)
    barrier = queue.submit_barrier([recorded])
    seen.call("wait on the kernel's event while recording", recorded.wait)
    graph.release()
    seen.note("state after the graph is destroyed", queue.state)
    seen.call("wait on the kernel's event", recorded.wait)
    seen.note("the kernel's event complete", recorded.complete)
    seen.call("wait on the barrier's event", barrier.wait)
    seen.note("counter (nothing ran)", counter.value)
    return seen


def scenario_wait_on_node_event_while_executable_graph_lives(rt):
    """event.wait() on a node's event throws while the executable graph made from it lives,
    the modifiable graph gone; it returns once the executable graph is destroyed."""
    seen = Observations()
    queue, counter = rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(queue)
    graph.begin_recording(queue)
    recorded = queue.submit(counter.increment)
    graph.end_recording()
    exec_graph = graph.finalize()
    graph.release()
    seen.call("wait on the kernel's event (executable graph alive)", recorded.wait)
    queue.submit_graph(exec_graph)
    queue.wait()
    seen.note("counter after the graph ran", counter.value)
    exec_graph.release()
    seen.call("wait on the kernel's event (executable graph destroyed)", recorded.wait)
    return seen


def scenario_recording_queue_depends_on_another_graphs_event(rt):
    """A queue recording into one graph submits with a dependency on a node of another graph:
    while that graph records, after its recording ended, and once it is destroyed."""
    seen = Observations()
    a, b, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    first, second = rt.new_graph(a), rt.new_graph(b)
    first.begin_recording(a)
    second.begin_recording(b)
    recorded_on_a = a.submit(counter.increment)
    seen.call(
        "B records a kernel depending on A's graph's event",
        b.submit,
        counter.increment,
        depends_on=[recorded_on_a],
    )
    seen.call("B records a barrier over A's graph's event", b.submit_barrier, [recorded_on_a])
    seen.note("B's state", b.state)
    first.end_recording()
    seen.call(
        "... after A's recording ended",
        b.submit,
        counter.increment,
        depends_on=[recorded_on_a],
    )
    first.release()
    seen.call(
        "... after A's graph is destroyed",
        b.submit,
        counter.increment,
        depends_on=[recorded_on_a],
    )
    seen.call("B records a kernel", b.submit, counter.increment)
    second.end_recording()
    b.submit_graph(second.finalize())
    b.wait()
    seen.note("counter after B's graph ran", counter.value)
    return seen


def scenario_two_queues_begin_recording_into_one_graph(rt):
    """begin_recording of a second queue into a graph another queue records: both record, and
    the graph runs the work of both (the command-buffer path; native recording takes one
    queue per graph)."""
    seen = Observations()
    a, b, counter = rt.new_queue(), rt.new_queue(), rt.new_counter()
    graph = rt.new_graph(a)
    graph.begin_recording(a)
    seen.call("begin_recording of B into the same graph", graph.begin_recording, b)
    seen.note("B's state", b.state)
    a.submit(counter.increment)
    b.submit(counter.increment)
    graph.end_recording()
    seen.note("states after end_recording()", [a.state, b.state])
    a.submit_graph(graph.finalize())
    a.wait()
    seen.note("counter after the graph ran", counter.value)
    return seen


def all_scenarios() -> dict:
    """name -> scenario function, in the order they are defined."""
    return {
        name: function
        for name, function in globals().items()
        if name.startswith("scenario_") and callable(function)
    }
