//! The local shard cache of remote caches: one directory of verified shard files, named
//! by their SHA-256 (`<sha256>.bin`), under a byte budget, shared by every process on the
//! node that uses the same directory.
//!
//! Invariants:
//! - A `<sha256>.bin` file is complete and its contents hash to its name: it appears only
//!   by rename of a fully written and verified temporary file (`<sha256>.<pid>.<n>.tmp`),
//!   and is never written afterwards. Content addressing means a changed object on the
//!   server can never be mixed with cached bytes of the old one.
//! - One process at a time downloads a given shard: `lockShard` holds an exclusive flock
//!   on `<sha256>.lock`; the others wait and then find the file present. Evicting a
//!   shard removes its lock file too unless a download holds it (the unlink happens under
//!   the file's own flock, and `lockShard` retries on a file unlinked while it waited), so
//!   lock files do not pile up with every shard ever fetched.
//! - `makeRoom` (under the exclusive flock of `.evict.lock`) unlinks the least recently
//!   used shards until the new one fits the budget. A shard a reader still holds open stays
//!   readable (the descriptor keeps the inode) and frees its space when closed: evicted
//!   but still open files add at most the descriptors readers keep (64 per iterator or
//!   lookup).
//! - Pinned shards are not evicted while anything else can go: `pin` holds a shared
//!   flock on the shard file for as long as its descriptor is open (an iterator's
//!   look-ahead, in any process), and `makeRoom` unlinks an unpinned shard only while it
//!   holds a non-blocking exclusive flock on it. When pinned shards leave no room,
//!   `makeRoom` says so and a background fetch gives up; for a reader's own fetch it
//!   unlinks pinned shards too (oldest first): the files in the directory never exceed
//!   the budget.
//! - Files are renamed into place without an fsync (a cold read would wait for the disk):
//!   after a crash of the machine, a file can exist at its full size with contents that
//!   never reached the disk. So a shard whose inode last changed before this boot is
//!   hashed again on its first `lookup` of this boot (and dropped when it does not match);
//!   `lookup` touches every shard it returns, so it is trusted for the rest of the boot.
//! - `makeRoom` counts other processes' downloads in flight (their temporary files,
//!   whose shard lock they hold) against the budget, and removes temporary files whose
//!   lock is free: their process died mid-download.

const std = @import("std");
const posix = std.posix;
const status = @import("../base/status.zig");
const Sha256 = @import("../codec/sha256.zig").Sha256;
const publish = @import("../store/publish.zig");

pub const ShardCache = struct {
    dir: std.fs.Dir,
    /// The directory's path, for messages.
    path: []const u8,
    budget: u64,
    /// When this machine booted (see `changedThisBoot`).
    booted: i64,

    /// Opens (creating it and its parents) the directory `path`.
    pub fn open(path: []const u8, budget: u64) status.Error!ShardCache {
        if (budget == 0) return status.fail(error.InvalidArgument, "the shard cache budget must be greater than zero", .{});
        std.fs.cwd().makePath(path) catch |err| return failDir(err, path);
        const dir = std.fs.cwd().openDir(path, .{ .iterate = true }) catch |err| return failDir(err, path);
        return .{ .dir = dir, .path = path, .budget = budget, .booted = bootTime() };
    }

    pub fn close(sc: *ShardCache) void {
        sc.dir.close();
    }

    /// The cached shard `sha_hex` of `size` bytes, opened read-only (and marked as used
    /// now, for eviction), or null when it is not cached.
    pub fn lookup(sc: *ShardCache, sha_hex: []const u8, size: u64) status.Error!?posix.fd_t {
        var name_buf: [80]u8 = undefined;
        const name = binName(&name_buf, sha_hex);
        const fd = posix.openatZ(sc.dir.fd, name, .{ .ACCMODE = .RDONLY, .CLOEXEC = true }, 0) catch |err| switch (err) {
            error.FileNotFound => return null,
            else => return failDir(err, sc.path),
        };
        errdefer posix.close(fd);
        const st = posix.fstat(fd) catch |err| return failDir(err, sc.path);
        if (@as(u64, @intCast(st.size)) != size or (!changedThisBoot(sc.booted, st.ctime().sec) and !fileHashes(fd, sha_hex))) {
            // Not written by this cache (renamed files are verified), or not all on the
            // disk before a crash: drop it, fetch again.
            posix.close(fd);
            posix.unlinkatZ(sc.dir.fd, name, 0) catch {};
            return null;
        }
        posix.futimens(fd, null) catch {}; // least recently used: mtime is the last use
        return fd;
    }

    /// `lookup` and a shared flock on the file: while the descriptor is open the shard is
    /// not evicted. Null when it is not cached (or was evicted just before the lock).
    pub fn pin(sc: *ShardCache, sha_hex: []const u8, size: u64) status.Error!?posix.fd_t {
        const fd = (try sc.lookup(sha_hex, size)) orelse return null;
        return try pinOpen(sc, fd);
    }

    /// Takes the pin's shared flock on `fd` (an open shard of this cache): `fd`, or null
    /// (and `fd` closed) when the shard was evicted before the lock was taken.
    pub fn pinOpen(sc: *ShardCache, fd: posix.fd_t) status.Error!?posix.fd_t {
        posix.flock(fd, posix.LOCK.SH) catch |err| {
            posix.close(fd);
            return failDir(err, sc.path);
        };
        const st = posix.fstat(fd) catch |err| {
            posix.close(fd);
            return failDir(err, sc.path);
        };
        if (st.nlink == 0) {
            posix.close(fd);
            return null;
        }
        return fd;
    }

    /// Whether shard `sha_hex` of `size` bytes is cached (no descriptor kept).
    pub fn contains(sc: *ShardCache, sha_hex: []const u8, size: u64) bool {
        var name_buf: [80]u8 = undefined;
        const st = sc.dir.statFile(binName(&name_buf, sha_hex)) catch return false;
        return st.size == size;
    }

    /// Holds the download lock of shard `sha_hex` until `unlockShard`.
    pub fn lockShard(sc: *ShardCache, sha_hex: []const u8) status.Error!posix.fd_t {
        var buf: [80]u8 = undefined;
        const name = lockName(&buf, sha_hex);
        while (true) {
            const fd = posix.openatZ(sc.dir.fd, name, .{ .ACCMODE = .RDWR, .CREAT = true, .CLOEXEC = true }, 0o644) catch |err| return failDir(err, sc.path);
            posix.flock(fd, posix.LOCK.EX) catch |err| {
                posix.close(fd);
                return failDir(err, sc.path);
            };
            if (stillLinked(sc.dir, name, fd)) return fd;
            posix.close(fd); // dropped (`dropLock`) while this waited: lock the file there now
        }
    }

    pub fn unlockShard(sc: *ShardCache, lock: posix.fd_t) void {
        _ = sc;
        posix.close(lock); // releases the flock
    }

    /// Unlinks least recently used shards that are not pinned until `need` more bytes fit
    /// the budget. When pinned shards leave too little room: with `force` (a reader needs
    /// the shard now), unlinks pinned ones too, oldest first, so the budget holds; without,
    /// returns false and unlinks nothing pinned.
    pub fn makeRoom(sc: *ShardCache, gpa: std.mem.Allocator, need: u64, what: []const u8, force: bool) status.Error!bool {
        if (need > sc.budget) return status.fail(error.InvalidArgument, "the shard cache budget ({d} bytes) is smaller than {s} ({d} bytes); raise the budget", .{ sc.budget, what, need });
        const lock = posix.openatZ(sc.dir.fd, ".evict.lock", .{ .ACCMODE = .RDWR, .CREAT = true, .CLOEXEC = true }, 0o644) catch |err| return failDir(err, sc.path);
        defer posix.close(lock);
        posix.flock(lock, posix.LOCK.EX) catch |err| return failDir(err, sc.path);

        const Entry = struct { name: [81]u8, len: usize, size: u64, mtime: i128 };
        var entries: std.ArrayList(Entry) = .empty;
        defer entries.deinit(gpa);
        var total: u64 = 0;
        var it = sc.dir.iterate();
        while (it.next() catch |err| return failDir(err, sc.path)) |e| {
            if (e.kind != .file) continue;
            if (std.mem.endsWith(u8, e.name, ".tmp")) {
                // Another process's download in flight takes room it will keep.
                if (tempInFlight(sc.dir, e.name)) {
                    const st = sc.dir.statFile(e.name) catch continue; // committed meanwhile
                    total += st.size;
                }
                continue;
            }
            if (!std.mem.endsWith(u8, e.name, ".bin") or e.name.len > 80) continue;
            const st = sc.dir.statFile(e.name) catch continue; // evicted by another process
            var entry: Entry = .{ .name = undefined, .len = e.name.len, .size = st.size, .mtime = st.mtime };
            @memcpy(entry.name[0..e.name.len], e.name);
            try entries.append(gpa, entry);
            total += st.size;
        }
        if (total + need <= sc.budget) return true;
        std.mem.sort(Entry, entries.items, {}, struct {
            fn lt(_: void, a: Entry, b: Entry) bool {
                return a.mtime < b.mtime;
            }
        }.lt);
        for (entries.items) |*e| {
            if (total + need <= sc.budget) break;
            e.name[e.len] = 0;
            const name = e.name[0..e.len :0];
            const fd = posix.openatZ(sc.dir.fd, name, .{ .ACCMODE = .RDONLY, .CLOEXEC = true }, 0) catch {
                total -= e.size; // gone already
                e.size = 0;
                continue;
            };
            defer posix.close(fd);
            posix.flock(fd, posix.LOCK.EX | posix.LOCK.NB) catch continue; // pinned
            posix.unlinkatZ(sc.dir.fd, name, 0) catch {};
            dropLock(sc.dir, name[0 .. name.len - ".bin".len]);
            total -= e.size;
            e.size = 0;
        }
        if (total + need <= sc.budget or !force) return total + need <= sc.budget;
        for (entries.items) |e| {
            if (total + need <= sc.budget) break;
            if (e.size == 0) continue; // unlinked above
            sc.dir.deleteFile(e.name[0..e.len]) catch {};
            dropLock(sc.dir, e.name[0 .. e.len - ".bin".len]);
            total -= e.size;
        }
        return true;
    }

    /// Publishes the verified temporary file `tmp_name` as shard `sha_hex` and opens it.
    pub fn commit(sc: *ShardCache, tmp_name: []const u8, sha_hex: []const u8) status.Error!posix.fd_t {
        var name_buf: [80]u8 = undefined;
        const name = binName(&name_buf, sha_hex);
        // Same contents whoever wins: a plain rename is safe.
        sc.dir.rename(tmp_name, name) catch |err| return failDir(err, sc.path);
        return posix.openatZ(sc.dir.fd, name, .{ .ACCMODE = .RDONLY, .CLOEXEC = true }, 0) catch |err| failDir(err, sc.path);
    }

    /// A fresh temporary name for shard `sha_hex` in `buf`.
    pub fn tempName(buf: *[128]u8, sha_hex: []const u8) [:0]const u8 {
        const n = std.crypto.random.int(u32);
        return std.fmt.bufPrintZ(buf, "{s}.{d}.{x}.tmp", .{ sha_hex, std.os.linux.getpid(), n }) catch unreachable;
    }
};

/// When this machine booted, in seconds since the epoch (`btime` of /proc/stat); 0 when it
/// cannot be read (then every file counts as changed this boot: nothing is hashed again).
fn bootTime() i64 {
    var buf: [4096]u8 = undefined;
    const text = std.fs.cwd().readFile("/proc/stat", &buf) catch return 0;
    const at = std.mem.indexOf(u8, text, "\nbtime ") orelse return 0;
    const rest = text[at + "\nbtime ".len ..];
    const end = std.mem.indexOfScalar(u8, rest, '\n') orelse rest.len;
    return std.fmt.parseInt(i64, rest[0..end], 10) catch 0;
}

/// Whether a file whose inode last changed at `ctime_s` (seconds) was created, renamed
/// or touched since this machine booted at `booted`: then a crash did not lose its bytes.
pub fn changedThisBoot(booted: i64, ctime_s: i64) bool {
    return ctime_s >= booted;
}

/// Whether the contents of `fd` (a file just opened: read from its start) hash to
/// `sha_hex`; false when they cannot be read.
pub fn fileHashes(fd: posix.fd_t, sha_hex: []const u8) bool {
    const digest = publish.hashFile(.{ .handle = fd }, "") catch return false;
    return std.mem.eql(u8, &std.fmt.bytesToHex(digest.sha256, .lower), sha_hex);
}

fn binName(buf: *[80]u8, sha_hex: []const u8) [:0]const u8 {
    return std.fmt.bufPrintZ(buf, "{s}.bin", .{sha_hex}) catch unreachable;
}

/// Whether `<sha>.<pid>.<n>.tmp` is another process's download in flight. A download
/// holds its shard's lock (`lockShard`) from before its temporary file exists until the
/// file is renamed or removed, so a temporary file whose lock is free was left by a
/// process that died: it is removed (false). This process's own are not in flight here
/// (the caller counts them). The lock, not the pid, decides: processes in other pid
/// namespaces may share the directory.
fn tempInFlight(dir: std.fs.Dir, name: []const u8) bool {
    var parts = std.mem.splitScalar(u8, name, '.');
    const sha = parts.next() orelse return false;
    const pid = std.fmt.parseInt(i32, parts.next() orelse return false, 10) catch return false;
    if (pid == std.os.linux.getpid()) return false;
    if (sha.len > 64) return false;
    var buf: [80]u8 = undefined;
    const lock_name = lockName(&buf, sha);
    const lock = posix.openatZ(dir.fd, lock_name, .{ .ACCMODE = .RDWR, .CLOEXEC = true }, 0) catch |err| {
        if (err != error.FileNotFound) return true;
        dir.deleteFile(name) catch {}; // a download holds its lock file linked
        return false;
    };
    defer posix.close(lock); // releases the flock
    posix.flock(lock, posix.LOCK.EX | posix.LOCK.NB) catch return true; // downloading
    if (!stillLinked(dir, lock_name, lock)) return true; // dropped meanwhile: look again later
    dir.deleteFile(name) catch {};
    return false;
}

fn lockName(buf: *[80]u8, sha_hex: []const u8) [:0]const u8 {
    return std.fmt.bufPrintZ(buf, "{s}.lock", .{sha_hex}) catch unreachable;
}

/// Whether the open lock file `fd` is still the file named `name`: `dropLock` unlinks a
/// lock file only while it holds its flock, so a lock taken on a file unlinked meanwhile
/// excludes no one.
fn stillLinked(dir: std.fs.Dir, name: [:0]const u8, fd: posix.fd_t) bool {
    const held = posix.fstat(fd) catch return false;
    const named = posix.fstatatZ(dir.fd, name, 0) catch return false;
    return held.ino == named.ino and held.dev == named.dev;
}

/// Removes the lock file of shard `sha_hex` (just evicted) unless a download holds it, so
/// the directory keeps about one lock file per cached shard, not one per shard ever
/// fetched.
fn dropLock(dir: std.fs.Dir, sha_hex: []const u8) void {
    if (sha_hex.len > 64) return; // not a shard of this cache
    var buf: [80]u8 = undefined;
    const name = lockName(&buf, sha_hex);
    const fd = posix.openatZ(dir.fd, name, .{ .ACCMODE = .RDWR, .CLOEXEC = true }, 0) catch return;
    defer posix.close(fd);
    posix.flock(fd, posix.LOCK.EX | posix.LOCK.NB) catch return; // a download holds it
    if (stillLinked(dir, name, fd)) posix.unlinkatZ(dir.fd, name, 0) catch {};
}

fn failDir(err: anyerror, path: []const u8) status.Error {
    return status.fail(error.Io, "shard cache {s}: {s}", .{ path, status.describeOsError(err) });
}

// ---------------------------------------------------------------- tests

const testing = std.testing;

/// A shard cache of `budget` bytes in a new temporary directory.
const TestCache = struct {
    tmp: testing.TmpDir,
    root: []u8,
    sc: ShardCache,

    fn open(budget: u64) !TestCache {
        var tmp = testing.tmpDir(.{});
        errdefer tmp.cleanup();
        const root = try tmp.dir.realpathAlloc(testing.allocator, ".");
        errdefer testing.allocator.free(root);
        return .{ .tmp = tmp, .root = root, .sc = try ShardCache.open(root, budget) };
    }

    fn close(t: *TestCache) void {
        t.sc.close();
        testing.allocator.free(t.root);
        t.tmp.cleanup();
    }
};

test "lookup, commit, and eviction of the least recently used shards" {
    var t = try TestCache.open(10);
    defer t.close();
    const sc = &t.sc;
    try testing.expectEqual(@as(?posix.fd_t, null), try sc.lookup("aa", 4));
    var names: [3][128]u8 = undefined;
    for ([_][]const u8{ "aa", "bb", "cc" }, 0..) |sha, i| {
        try testing.expect(try sc.makeRoom(testing.allocator, 4, "a shard", false));
        const tmp_name = ShardCache.tempName(&names[i], sha);
        try sc.dir.writeFile(.{ .sub_path = tmp_name, .data = "1234" });
        const fd = try sc.commit(tmp_name, sha);
        posix.close(fd);
        // Distinct, increasing mtimes.
        var bin: [80]u8 = undefined;
        const f = try sc.dir.openFile(binName(&bin, sha), .{});
        try f.updateTimes(@intCast(i * std.time.ns_per_s), @intCast(i * std.time.ns_per_s));
        f.close();
    }
    // 3 * 4 > 10: the oldest ("aa") went when "cc" came.
    try testing.expectEqual(@as(?posix.fd_t, null), try sc.lookup("aa", 4));
    const b = (try sc.lookup("bb", 4)).?;
    posix.close(b);
    // A wrong size is not trusted.
    try testing.expectEqual(@as(?posix.fd_t, null), try sc.lookup("cc", 5));
    try testing.expectError(error.InvalidArgument, sc.makeRoom(testing.allocator, 11, "a shard", true));

    // Only "bb" is left. A pinned shard is never evicted, however old: with "bb" pinned
    // and oldest, "dd" goes; with "bb" and "ee" pinned there is no room and nothing goes.
    const pinned = (try sc.pin("bb", 4)).?;
    try setMtime(sc.dir, "bb", 0);
    try addShard(sc, "dd", 5);
    try testing.expect(try sc.makeRoom(testing.allocator, 4, "a shard", false));
    try testing.expect(sc.contains("bb", 4) and !sc.contains("dd", 4));
    try addShard(sc, "ee", 6);
    const pinned2 = (try sc.pin("ee", 4)).?;
    try testing.expect(!try sc.makeRoom(testing.allocator, 4, "a shard", false));
    try testing.expect(sc.contains("bb", 4) and sc.contains("ee", 4));
    // A reader's own fetch keeps the budget: the oldest pinned shard goes (its holder
    // still reads it through the descriptor).
    try testing.expect(try sc.makeRoom(testing.allocator, 4, "a shard", true));
    try testing.expect(!sc.contains("bb", 4) and sc.contains("ee", 4));
    var back: [4]u8 = undefined;
    try testing.expectEqual(@as(usize, 4), try posix.pread(pinned, &back, 0));
    try addShard(sc, "bb", 0);
    // Unpinned: evictable again.
    posix.close(pinned);
    try testing.expect(try sc.makeRoom(testing.allocator, 4, "a shard", false));
    try testing.expect(!sc.contains("bb", 4) and sc.contains("ee", 4));
    posix.close(pinned2);
}

test "downloads of other processes: in flight count against the budget, dead ones go" {
    var t = try TestCache.open(10);
    defer t.close();
    const sc = &t.sc;
    try addShard(sc, "cc", 0); // 4 bytes
    // "aa" of a process that died (its lock is free), "bb" of one still downloading (its
    // lock is held: flock conflicts between descriptors of one process too).
    try sc.dir.writeFile(.{ .sub_path = "aa.1.7.tmp", .data = "12345678" });
    try sc.dir.writeFile(.{ .sub_path = "bb.1.7.tmp", .data = "123456" });
    const held = try sc.lockShard("bb");
    // 4 ("cc") + 6 (in flight) + 4 > 10: "cc" goes; the dead download is removed.
    try testing.expect(try sc.makeRoom(testing.allocator, 4, "a shard", false));
    try testing.expect(!sc.contains("cc", 4));
    try testing.expectError(error.FileNotFound, sc.dir.statFile("aa.1.7.tmp"));
    _ = try sc.dir.statFile("bb.1.7.tmp");
    // Without room besides the download in flight, a background fetch gets none.
    try testing.expect(!try sc.makeRoom(testing.allocator, 5, "a shard", false));
    // Once its process is gone (lock released), the temporary file goes too.
    sc.unlockShard(held);
    try testing.expect(try sc.makeRoom(testing.allocator, 10, "a shard", false));
    try testing.expectError(error.FileNotFound, sc.dir.statFile("bb.1.7.tmp"));
}

test "a shard last changed before this boot is hashed again before it is trusted" {
    var t = try TestCache.open(100);
    defer t.close();
    const sc = &t.sc;
    try testing.expect(sc.booted > 0);
    var digest: [32]u8 = undefined;
    Sha256.hash("1234", &digest);
    const sha = std.fmt.bytesToHex(digest, .lower);
    var name_buf: [128]u8 = undefined;
    const tmp_name = ShardCache.tempName(&name_buf, &sha);
    try sc.dir.writeFile(.{ .sub_path = tmp_name, .data = "1234" });
    posix.close(try sc.commit(tmp_name, &sha));
    // As after a reboot: every file changed before it.
    sc.booted = std.time.timestamp() + 3600;
    posix.close((try sc.lookup(&sha, 4)).?); // hashes to its name: kept
    // The same size, zeros (what a crash can leave of a renamed file that was never
    // written back): dropped, so the shard is fetched again.
    var bin: [80]u8 = undefined;
    try sc.dir.writeFile(.{ .sub_path = binName(&bin, &sha), .data = "\x00\x00\x00\x00" });
    try testing.expectEqual(@as(?posix.fd_t, null), try sc.lookup(&sha, 4));
    try testing.expect(!sc.contains(&sha, 4));
}

test "an evicted shard's lock file goes with it, unless a download holds it" {
    var t = try TestCache.open(8);
    defer t.close();
    const sc = &t.sc;
    for ([_][]const u8{ "aa", "bb" }, 0..) |sha, i| {
        sc.unlockShard(try sc.lockShard(sha)); // as a download leaves it
        try addShard(sc, sha, i);
    }
    const held = try sc.lockShard("bb"); // a download of "bb" (evicted meanwhile)
    try testing.expect(try sc.makeRoom(testing.allocator, 8, "a shard", false));
    try testing.expect(!sc.contains("aa", 4) and !sc.contains("bb", 4));
    try testing.expectError(error.FileNotFound, sc.dir.statFile("aa.lock"));
    _ = try sc.dir.statFile("bb.lock");
    sc.unlockShard(held);
    // A dropped lock file is made again by the next download.
    const fresh = try sc.lockShard("aa");
    defer sc.unlockShard(fresh);
    var buf: [80]u8 = undefined;
    try testing.expect(stillLinked(sc.dir, lockName(&buf, "aa"), fresh));
}

test "a download waiting for a lock file that is dropped locks the file there after" {
    var t = try TestCache.open(8);
    defer t.close();
    const sc = &t.sc;
    const held = try sc.lockShard("cc");
    const Waiter = struct {
        fn run(cache: *ShardCache, out: *posix.fd_t) void {
            out.* = cache.lockShard("cc") catch -1;
        }
    };
    var got: posix.fd_t = -1;
    const waiter = try std.Thread.spawn(.{}, Waiter.run, .{ sc, &got });
    std.Thread.sleep(50 * std.time.ns_per_ms); // (it waits in flock by now)
    try sc.dir.deleteFile("cc.lock"); // as `dropLock` does, under the lock
    sc.unlockShard(held);
    waiter.join();
    defer sc.unlockShard(got);
    var buf: [80]u8 = undefined;
    try testing.expect(got >= 0 and stillLinked(sc.dir, lockName(&buf, "cc"), got));
}

fn setMtime(dir: std.fs.Dir, sha: []const u8, seconds: u64) !void {
    var bin: [80]u8 = undefined;
    const f = try dir.openFile(binName(&bin, sha), .{});
    defer f.close();
    try f.updateTimes(@intCast(seconds * std.time.ns_per_s), @intCast(seconds * std.time.ns_per_s));
}

fn addShard(sc: *ShardCache, sha: []const u8, mtime_s: u64) !void {
    var name_buf: [128]u8 = undefined;
    const tmp_name = ShardCache.tempName(&name_buf, sha);
    try sc.dir.writeFile(.{ .sub_path = tmp_name, .data = "1234" });
    posix.close(try sc.commit(tmp_name, sha));
    try setMtime(sc.dir, sha, mtime_s);
}
