//! The runtime: a fixed pool of exactly `num_workers` threads, started when the runtime
//! opens, shared by every dataset and writer opened from it. Work arrives as intrusive
//! `Job` nodes owned by the submitter, so the pool itself never allocates after start and
//! its queue can never hold more jobs than submitters have bounded themselves to.
//!
//! Lifetime is reference counted: the C handle holds one reference and every dataset and
//! writer holds one, so the threads stop only when the last user is gone. Handles record
//! the process id that created them; a forked child gets `error.Forked` instead of
//! waiting forever on threads that do not exist in it.

const std = @import("std");
const status = @import("status.zig");

pub const Job = struct {
    run: *const fn (job: *Job) void,
    next: ?*Job = null,
};

/// A pool job its submitter can take back or wait for. `idle` until `submit`, `queued`
/// until its `run` has called `finish` (or it was taken back), then `done` until the
/// owner `reset`s it. The owner's `run` reaches its own struct from `job` with
/// `@fieldParentPtr` twice (job in task, task in owner) and calls `finish` last.
pub const Task = struct {
    job: Job,
    state: std.atomic.Value(u32) = .init(idle),

    pub const idle = 0;
    pub const queued = 1;
    pub const done = 2;

    pub fn init(run: *const fn (job: *Job) void) Task {
        return .{ .job = .{ .run = run } };
    }

    pub fn submit(t: *Task, pool: *Pool) void {
        std.debug.assert(t.state.load(.monotonic) == idle);
        t.state.store(queued, .monotonic);
        pool.submit(&t.job);
    }

    /// The last step of the job's `run`.
    pub fn finish(t: *Task) void {
        t.state.store(done, .release);
        std.Thread.Futex.wake(&t.state, 1);
    }

    /// Leaves the task not queued: one no worker has started is taken back (true: it
    /// will never run, and is `done`), a running one waited for (false).
    pub fn takeBack(t: *Task, pool: *Pool) bool {
        if (t.state.load(.acquire) != queued) return false;
        if (pool.cancel(&t.job)) {
            t.state.store(done, .monotonic);
            return true;
        }
        t.wait();
        return false;
    }

    /// Waits until a queued task has run.
    pub fn wait(t: *Task) void {
        while (t.state.load(.acquire) == queued) std.Thread.Futex.wait(&t.state, queued);
    }

    pub fn is(t: *const Task, state: u32) bool {
        return t.state.load(.acquire) == state;
    }

    pub fn reset(t: *Task) void {
        std.debug.assert(t.state.load(.monotonic) != queued);
        t.state.store(idle, .monotonic);
    }
};

pub const Pool = struct {
    mutex: std.Thread.Mutex = .{},
    cond: std.Thread.Condition = .{},
    head: ?*Job = null,
    tail: ?*Job = null,
    stopping: bool = false,
    threads: []std.Thread = &.{},

    fn start(pool: *Pool, gpa: std.mem.Allocator, count: usize) status.Error!void {
        pool.threads = try gpa.alloc(std.Thread, count);
        var started: usize = 0;
        errdefer {
            pool.stopAndJoin(pool.threads[0..started]);
            gpa.free(pool.threads);
        }
        while (started < count) : (started += 1) {
            pool.threads[started] = std.Thread.spawn(.{ .stack_size = 1 << 20 }, worker, .{pool}) catch
                return status.fail(error.Internal, "failed to start worker thread", .{});
            pool.threads[started].setName("dataset-rt-work") catch {};
        }
    }

    fn stopAndJoin(pool: *Pool, threads: []std.Thread) void {
        pool.mutex.lock();
        pool.stopping = true;
        pool.cond.broadcast();
        pool.mutex.unlock();
        for (threads) |t| t.join();
    }

    /// Queues `job` to run once on some worker. The job memory must stay valid until its
    /// `run` has returned; `run` must not block on other jobs of the same pool.
    pub fn submit(pool: *Pool, job: *Job) void {
        job.next = null;
        pool.mutex.lock();
        defer pool.mutex.unlock();
        if (pool.tail) |tail| tail.next = job else pool.head = job;
        pool.tail = job;
        pool.cond.signal();
    }

    /// Removes `job` from the queue if no worker has taken it yet. Returns true when it was
    /// removed (it will never run), false when it is running or has run.
    pub fn cancel(pool: *Pool, job: *Job) bool {
        pool.mutex.lock();
        defer pool.mutex.unlock();
        var prev: ?*Job = null;
        var cur = pool.head;
        while (cur) |c| : ({
            prev = c;
            cur = c.next;
        }) {
            if (c != job) continue;
            if (prev) |p| p.next = c.next else pool.head = c.next;
            if (pool.tail == c) pool.tail = prev;
            c.next = null;
            return true;
        }
        return false;
    }

    fn worker(pool: *Pool) void {
        while (true) {
            pool.mutex.lock();
            while (pool.head == null and !pool.stopping) pool.cond.wait(&pool.mutex);
            const job = pool.head orelse {
                pool.mutex.unlock();
                return;
            };
            pool.head = job.next;
            if (pool.head == null) pool.tail = null;
            pool.mutex.unlock();
            job.run(job);
        }
    }
};

pub const Runtime = struct {
    gpa: std.mem.Allocator,
    num_workers: usize,
    pool: Pool = .{},
    refs: std.atomic.Value(u32) = .init(1),
    pid: std.posix.pid_t,
    /// A private anonymous page marked MADV_WIPEONFORK holding a non-zero byte: a forked
    /// child sees it zeroed, so `checkPid` (run on every call, get_item included) needs
    /// no getpid system call. Null where the kernel refuses (before Linux 4.14): then
    /// the pid is compared.
    fork_guard: ?[]align(std.heap.page_size_min) u8 = null,

    /// Starts the pool. Postcondition: exactly num_workers threads are running.
    pub fn open(gpa: std.mem.Allocator, num_workers: u64) status.Error!*Runtime {
        if (num_workers == 0) return status.fail(error.InvalidArgument, "num_workers must be greater than zero", .{});
        if (num_workers > 4096) return status.fail(error.InvalidArgument, "num_workers must be at most 4096", .{});
        const rt = try gpa.create(Runtime);
        errdefer gpa.destroy(rt);
        rt.* = .{ .gpa = gpa, .num_workers = @intCast(num_workers), .pid = currentPid(), .fork_guard = forkGuard() };
        errdefer if (rt.fork_guard) |g| std.posix.munmap(g);
        try rt.pool.start(gpa, rt.num_workers);
        return rt;
    }

    pub fn retain(rt: *Runtime) *Runtime {
        _ = rt.refs.fetchAdd(1, .monotonic);
        return rt;
    }

    /// Drops one reference; the last one stops and joins the workers. In a forked child
    /// the threads do not exist, so nothing is joined or freed there.
    pub fn release(rt: *Runtime) void {
        if (rt.refs.fetchSub(1, .acq_rel) != 1) return;
        if (rt.pid != currentPid()) return;
        rt.pool.stopAndJoin(rt.pool.threads);
        rt.gpa.free(rt.pool.threads);
        if (rt.fork_guard) |g| std.posix.munmap(g);
        rt.gpa.destroy(rt);
    }

    /// error.Forked when called in a process other than the one that opened the runtime.
    pub fn checkPid(rt: *const Runtime) status.Error!void {
        if (rt.fork_guard) |g| {
            if (@as(*const volatile u8, &g[0]).* != 0) return;
            return forkedError();
        }
        if (rt.pid != currentPid()) return forkedError();
    }
};

/// The page of `Runtime.fork_guard`, or null when it cannot be made.
fn forkGuard() ?[]align(std.heap.page_size_min) u8 {
    const page = std.posix.mmap(null, std.heap.page_size_min, std.posix.PROT.READ | std.posix.PROT.WRITE, .{ .TYPE = .PRIVATE, .ANONYMOUS = true }, -1, 0) catch return null;
    std.posix.madvise(page.ptr, page.len, std.posix.MADV.WIPEONFORK) catch {
        std.posix.munmap(page);
        return null;
    };
    page[0] = 1;
    return page;
}

pub fn forkedError() status.Error {
    return status.fail(error.Forked, "dataset_rt objects cannot be used in a forked child process; create the runtime and dataset in the child", .{});
}

pub fn currentPid() std.posix.pid_t {
    return std.os.linux.getpid();
}

test "pool runs every job" {
    const Counter = struct {
        job: Job = .{ .run = run },
        hits: *std.atomic.Value(u32),
        fn run(job: *Job) void {
            const self: *@This() = @fieldParentPtr("job", job);
            _ = self.hits.fetchAdd(1, .monotonic);
        }
    };
    const rt = try Runtime.open(std.testing.allocator, 3);
    var hits = std.atomic.Value(u32).init(0);
    var jobs: [100]Counter = undefined;
    for (&jobs) |*j| {
        j.* = .{ .hits = &hits };
        rt.pool.submit(&j.job);
    }
    while (hits.load(.monotonic) < jobs.len) std.Thread.yield() catch {};
    rt.release();
    try std.testing.expectEqual(@as(u32, 100), hits.load(.monotonic));
    try std.testing.expectError(error.InvalidArgument, Runtime.open(std.testing.allocator, 0));
}

test "Task: taken back while no worker has started it, else waited for" {
    const rt = try Runtime.open(std.testing.allocator, 1);
    defer rt.release();
    const Counted = struct {
        task: Task = .init(run),
        hits: u32 = 0,
        started: std.Thread.ResetEvent = .{},
        release: std.Thread.ResetEvent = .{},
        fn run(job: *Job) void {
            const task: *Task = @fieldParentPtr("job", job);
            const self: *@This() = @fieldParentPtr("task", task);
            self.started.set();
            self.release.wait();
            self.hits += 1;
            task.finish();
        }
    };
    // The only worker is held by `a`, so `b` stays queued and is taken back.
    var a: Counted = .{};
    var b: Counted = .{};
    a.task.submit(&rt.pool);
    a.started.wait();
    b.task.submit(&rt.pool);
    try std.testing.expect(b.task.takeBack(&rt.pool));
    try std.testing.expect(b.task.is(Task.done) and b.hits == 0);
    // `a` is running: waited for, not taken back.
    a.release.set();
    try std.testing.expect(!a.task.takeBack(&rt.pool));
    try std.testing.expect(a.task.is(Task.done) and a.hits == 1);
    // Idle again, it may be submitted again; a done task is not taken back.
    a.task.reset();
    a.release.reset();
    a.release.set();
    a.task.submit(&rt.pool);
    a.task.wait();
    try std.testing.expect(!a.task.takeBack(&rt.pool) and a.hits == 2);
}

test "checkPid: fine in the opening process, error.Forked in a forked child" {
    const rt = try Runtime.open(std.testing.allocator, 1);
    defer rt.release();
    try rt.checkPid();
    const pid = try std.posix.fork();
    if (pid == 0) {
        // The child: the guard page reads as zero (or the pid differs).
        const code: u8 = if (rt.checkPid()) |_| 1 else |err| if (err == error.Forked) 0 else 2;
        std.posix.exit(code);
    }
    const result = std.posix.waitpid(pid, 0);
    try std.testing.expect(std.posix.W.IFEXITED(result.status));
    try std.testing.expectEqual(@as(u32, 0), std.posix.W.EXITSTATUS(result.status));
    try rt.checkPid();
}
