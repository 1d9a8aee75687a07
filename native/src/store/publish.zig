//! Publishing files and caches atomically, and hashing them: the one copy of these steps,
//! used by the writer, the fragment commit, manifest migration and dataset snapshots.
//!
//! A cache is built in a staging directory `<base>/tmp/<name prefix>.<random>.drt` held
//! under an exclusive `flock`, its files written and fsynced, `manifest.json` written
//! last, the directory fsynced and renamed into place with `renameat2(RENAME_NOREPLACE)`
//! (or exchanged with an existing cache when replacing), then `<base>` fsynced.
//!
//! Invariants:
//! - Nothing appears at `<base>/<name>` until `Staging.publish` succeeds; a discarded
//!   staging directory is removed.
//! - A staging directory is locked for its owner's lifetime. Creating and locking one
//!   happens under a shared lock on `<base>/tmp`, and the sweep takes that lock
//!   exclusively, so the sweep never removes a fresh directory before its owner locked it;
//!   it removes only directories whose lock it can take (their owner died).
//! - `publishFile` never leaves a partial file under the final name: the bytes go to a
//!   temporary file in the same directory, fsynced, then renamed.
//! - Directories that are locked or fsynced are opened without O_PATH (`.iterate = true`):
//!   flock and fsync reject O_PATH descriptors.

const std = @import("std");
const linux = std.os.linux;
const posix = std.posix;
const status = @import("../base/status.zig");
const manifest = @import("../format/manifest.zig");
const Sha256 = @import("../codec/sha256.zig").Sha256;
const arrow = @import("../format/arrow.zig");
const schema = @import("../format/schema.zig");

const rename_noreplace: u32 = 1;
const rename_exchange: u32 = 2;

/// Size and SHA-256 of a file's contents.
pub const Digest = struct { byte_len: u64, sha256: [32]u8 };

/// Hashes the rest of an open file. `path` names it in error messages.
pub fn hashFile(file: std.fs.File, path: []const u8) status.Error!Digest {
    var hasher: Sha256 = .init();
    var buf: [1 << 17]u8 = undefined;
    var total: u64 = 0;
    while (true) {
        const n = file.read(&buf) catch |err| return status.failIo(err, path);
        if (n == 0) break;
        hasher.update(buf[0..n]);
        total += n;
    }
    return .{ .byte_len = total, .sha256 = hasher.finalResult() };
}

/// Hashes the file at `path` (a regular file, see `openRegular`).
pub fn hashPath(path: [:0]const u8) status.Error!Digest {
    const file = try openRegular(posix.AT.FDCWD, path, path);
    defer file.close();
    return hashFile(file, path);
}

/// Opens `name` (relative to `dir`) for reading, provided it is a regular file: a FIFO
/// would block the open and a device (`/dev/zero`) never end a read, so anything else
/// fails as an invalid cache ("not a regular file: <path>"). `path` names it in errors.
pub fn openRegular(dir: posix.fd_t, name: [:0]const u8, path: []const u8) status.Error!std.fs.File {
    // O_NONBLOCK: opening a FIFO returns at once (it changes nothing for a regular file).
    const fd = posix.openatZ(dir, name, .{ .ACCMODE = .RDONLY, .NONBLOCK = true, .CLOEXEC = true }, 0) catch |err| return status.failIo(err, path);
    errdefer posix.close(fd);
    const st = posix.fstat(fd) catch |err| return status.failIo(err, path);
    if (!posix.S.ISREG(st.mode)) return status.fail(error.InvalidCache, "not a regular file: {s}", .{path});
    return .{ .handle = fd };
}

/// Maps the whole of an open file read-only (private); an empty file is an empty slice
/// (mmap refuses length 0). `path` names it in errors. Release with `unmapFile`.
pub fn mapFile(file: std.fs.File, path: []const u8) status.Error![]align(std.heap.page_size_min) const u8 {
    const size = (file.stat() catch |err| return status.failIo(err, path)).size;
    if (size == 0) return &.{};
    return posix.mmap(null, @intCast(size), posix.PROT.READ, .{ .TYPE = .PRIVATE }, file.handle, 0) catch |err| status.failIo(err, path);
}

pub fn unmapFile(map: []align(std.heap.page_size_min) const u8) void {
    if (map.len > 0) posix.munmap(map);
}

/// Fails with "checksum mismatch for <path>" unless `digest` spells `expected_hex`
/// exactly (manifests hold lowercase hex; any other spelling is a changed file).
pub fn verifyDigest(digest: [32]u8, expected_hex: []const u8, path: []const u8) status.Error!void {
    const actual = std.fmt.bytesToHex(digest, .lower);
    if (!std.mem.eql(u8, &actual, expected_hex)) return status.fail(error.InvalidCache, "checksum mismatch for {s}", .{path});
}

/// Copies `src` to the new file `dst` in `dir` (fsynced) and returns what was copied.
pub fn copyFile(src: [:0]const u8, dir: std.fs.Dir, dst: [:0]const u8) status.Error!Digest {
    const in = std.fs.cwd().openFileZ(src, .{}) catch |err| return status.failIo(err, src);
    defer in.close();
    const out = dir.createFileZ(dst, .{ .exclusive = true }) catch |err| return status.failIo(err, src);
    defer out.close();
    var hasher: Sha256 = .init();
    var buf: [1 << 17]u8 = undefined;
    var total: u64 = 0;
    while (true) {
        const n = in.read(&buf) catch |err| return status.failIo(err, src);
        if (n == 0) break;
        hasher.update(buf[0..n]);
        out.writeAll(buf[0..n]) catch |err| return status.failIo(err, src);
        total += n;
    }
    out.sync() catch |err| return status.failIo(err, src);
    return .{ .byte_len = total, .sha256 = hasher.finalResult() };
}

/// Buffered file output that hashes everything it writes.
pub const HashedFile = struct {
    file: std.fs.File,
    hasher: Sha256,
    buffer: std.ArrayList(u8) = .empty,
    written: u64 = 0,

    const flush_bytes = 1 << 20;
    /// Appends this large are written from the caller's buffer (after what is buffered),
    /// not copied into the buffer first.
    const direct_bytes = 64 << 10;

    pub fn append(self: *HashedFile, gpa: std.mem.Allocator, bytes: []const u8, path: []const u8) status.Error!void {
        self.hasher.update(bytes);
        self.written += bytes.len;
        if (bytes.len >= direct_bytes) {
            try self.flush(path);
            self.file.writeAll(bytes) catch |err| return status.failIo(err, path);
            return;
        }
        if (self.buffer.items.len + bytes.len > flush_bytes) try self.flush(path);
        try self.buffer.appendSlice(gpa, bytes);
    }

    fn flush(self: *HashedFile, path: []const u8) status.Error!void {
        if (self.buffer.items.len == 0) return;
        self.file.writeAll(self.buffer.items) catch |err| return status.failIo(err, path);
        self.buffer.clearRetainingCapacity();
    }

    /// Flushes, fsyncs and closes; returns the digest.
    pub fn finish(self: *HashedFile, path: []const u8) status.Error![32]u8 {
        try self.flush(path);
        self.file.sync() catch |err| return status.failIo(err, path);
        self.file.close();
        self.file = undefined;
        return self.hasher.finalResult();
    }

    pub fn deinit(self: *HashedFile, gpa: std.mem.Allocator, open: bool) void {
        if (open) self.file.close();
        self.buffer.deinit(gpa);
    }
};

/// Checks a cache name: not empty, a plain path segment other than "tmp", valid UTF-8.
pub fn checkName(name: []const u8) status.Error!void {
    if (name.len == 0) return status.fail(error.InvalidArgument, "CacheSource.name must not be empty", .{});
    if (!manifest.isPlainSegment(name)) return status.fail(error.InvalidArgument, "CacheSource.name must be a plain path segment", .{});
    if (std.mem.eql(u8, name, "tmp")) return status.fail(error.InvalidArgument, "CacheSource.name must be a non-reserved plain path segment", .{});
    if (!std.unicode.utf8ValidateSlice(name)) return status.fail(error.InvalidArgument, "CacheSource.name must be valid UTF-8", .{});
}

pub fn checkBase(base: []const u8) status.Error!void {
    if (base.len == 0 or std.mem.indexOfScalar(u8, base, 0) != null) return status.fail(error.InvalidArgument, "invalid cache base directory", .{});
}

/// A staging directory `<base>/tmp/<name prefix>.<random>.drt` for the cache `<base>/<name>`,
/// created with a `shards/` directory and held under an exclusive flock until `dir` is
/// closed. Used by the writer and by the fragment commit.
pub const Staging = struct {
    /// `<base>` as given, `<base>/<name>`, and the staging directory path.
    base_path: []u8,
    dest_path: [:0]u8,
    staging_path: [:0]u8,
    dir: std.fs.Dir,
    published: bool = false,

    /// Creates `<base>` (with parents) and `<base>/tmp`, sweeps abandoned staging
    /// directories, and creates and locks a fresh one. Fails with error.Exists ("cache
    /// path already exists") when anything is at `<base>/<name>`, unless `replace`.
    /// The caller checked `name` (checkName) and `base` (checkBase).
    pub fn create(gpa: std.mem.Allocator, base: []const u8, name: []const u8, replace: bool) status.Error!Staging {
        const base_path = try gpa.dupe(u8, base);
        errdefer gpa.free(base_path);
        const dest_path = try std.fmt.allocPrintSentinel(gpa, "{s}/{s}", .{ base, name }, 0);
        errdefer gpa.free(dest_path);

        std.fs.cwd().makePath(base) catch |err| return status.failIo(err, base);
        var base_dir = std.fs.cwd().openDir(base, .{}) catch |err| return status.failIo(err, base);
        defer base_dir.close();
        // Anything at the destination counts, a dangling symlink included (no follow).
        if (posix.fstatat(base_dir.fd, name, posix.AT.SYMLINK_NOFOLLOW)) |_| {
            if (!replace) return status.fail(error.Exists, "cache path already exists: {s}", .{dest_path});
        } else |err| switch (err) {
            error.FileNotFound => {},
            else => return status.failIo(err, dest_path),
        }
        base_dir.makeDir("tmp") catch |err| switch (err) {
            error.PathAlreadyExists => {},
            else => return status.failIo(err, base),
        };
        var tmp_dir = base_dir.openDir("tmp", .{ .iterate = true }) catch |err| return status.failIo(err, base);
        defer tmp_dir.close();
        sweep(tmp_dir);

        // Create and lock the staging directory under a shared lock on tmp/ (see //!).
        posix.flock(tmp_dir.fd, posix.LOCK.SH) catch |err| return status.failIo(err, base);
        defer posix.flock(tmp_dir.fd, posix.LOCK.UN) catch {};
        var random_bytes: [8]u8 = undefined;
        std.crypto.random.bytes(&random_bytes);
        // At most 64 bytes of the name (cut on a UTF-8 boundary) keep staging names
        // readable and within NAME_MAX for every valid cache name.
        const prefix_len = status.utf8PrefixLen(name, 64);
        const staging_name = try std.fmt.allocPrint(gpa, "{s}.{s}.drt", .{ name[0..prefix_len], std.fmt.bytesToHex(random_bytes, .lower) });
        defer gpa.free(staging_name);
        const staging_path = try std.fmt.allocPrintSentinel(gpa, "{s}/tmp/{s}", .{ base, staging_name }, 0);
        errdefer gpa.free(staging_path);
        tmp_dir.makeDir(staging_name) catch |err| return status.failIo(err, staging_path);
        errdefer tmp_dir.deleteTree(staging_name) catch {};
        var staging_dir = tmp_dir.openDir(staging_name, .{ .iterate = true }) catch |err| return status.failIo(err, staging_path);
        errdefer staging_dir.close();
        posix.flock(staging_dir.fd, posix.LOCK.EX | posix.LOCK.NB) catch |err| return status.failIo(err, staging_path);
        staging_dir.makeDir("shards") catch |err| return status.failIo(err, staging_path);
        return .{ .base_path = base_path, .dest_path = dest_path, .staging_path = staging_path, .dir = staging_dir };
    }

    /// Writes `manifest.json` (the publication marker, last), fsyncs the staging
    /// directory and `shards/`, renames the directory into place (see `renameIntoPlace`)
    /// and fsyncs `<base>`. Every other file must be complete and fsynced already.
    pub fn publish(s: *Staging, manifest_text: []const u8, replace: bool) status.Error!void {
        try s.writeManifest(manifest_text);
        try s.rename(replace);
    }

    /// The first half of `publish` (the writer times the two halves separately).
    pub fn writeManifest(s: *Staging, manifest_text: []const u8) status.Error!void {
        const file = s.dir.createFile("manifest.json", .{ .exclusive = true }) catch |err| return status.failIo(err, s.staging_path);
        defer file.close();
        file.writeAll(manifest_text) catch |err| return status.failIo(err, s.staging_path);
        file.sync() catch |err| return status.failIo(err, s.staging_path);
    }

    /// Checks the `metadata.arrow` a caller wrote into the staging directory against the
    /// cache it completes: a readable Arrow IPC file of `sample_count` rows whose columns
    /// are `fields` (names and kinds, in order) without nulls. Fsyncs it and returns its
    /// SHA-256. Errors name the file: what the reader would say (`arrow.File.parse`), or
    /// "metadata.arrow has 4 rows, the cache 5 samples: <path>" and the like.
    pub fn checkMetadata(s: *Staging, gpa: std.mem.Allocator, fields: []const schema.Field, sample_count: u64) status.Error![32]u8 {
        const path = try std.fmt.allocPrint(gpa, "{s}/metadata.arrow", .{s.staging_path});
        defer gpa.free(path);
        // A regular file only: a FIFO would block the open, a directory fail the mapping.
        const file = try openRegular(s.dir.fd, "metadata.arrow", path);
        defer file.close();
        file.sync() catch |err| return status.failIo(err, path);
        const map = try mapFile(file, path);
        defer unmapFile(map);
        var parsed = arrow.File.parse(gpa, map) catch |err| return status.nameFile(err, path);
        defer parsed.deinit(gpa);
        // The path goes last through nameFile, which keeps it whole after long names.
        if (parsed.row_count != sample_count) {
            return status.nameFile(status.fail(error.InvalidArgument, "metadata.arrow has {d} rows, the cache {d} samples", .{ parsed.row_count, sample_count }), path);
        }
        if (parsed.fields.len != fields.len) {
            return status.nameFile(status.fail(error.InvalidArgument, "metadata.arrow has {d} columns, the schema {d}", .{ parsed.fields.len, fields.len }), path);
        }
        for (fields, parsed.fields, 0..) |want, got, i| {
            if (!std.mem.eql(u8, want.name, got.name) or got.type.kind() != want.kind) {
                return status.nameFile(status.fail(error.InvalidArgument, "metadata.arrow column {d} is not '{s}' ({s})", .{ i, want.name, want.kind.name() }), path);
            }
            for (parsed.batches) |b| {
                if (b.columns[i].null_count != 0) return status.nameFile(status.fail(error.InvalidArgument, "metadata.arrow column '{s}' has nulls", .{want.name}), path);
            }
        }
        var hasher: Sha256 = .init();
        hasher.update(map);
        return hasher.finalResult();
    }

    /// The second half of `publish`.
    pub fn rename(s: *Staging, replace: bool) status.Error!void {
        try syncDir(s.dir, "shards", s.staging_path);
        posix.fsync(s.dir.fd) catch |err| return status.failIo(err, s.staging_path);
        try renameIntoPlace(s.staging_path, s.dest_path, replace);
        s.published = true;
        try syncPath(s.base_path);
    }

    /// Closes (unlocks) the directory; removes it unless it was published.
    pub fn close(s: *Staging, gpa: std.mem.Allocator, forked: bool) void {
        s.dir.close();
        if (!s.published and !forked) std.fs.cwd().deleteTree(s.staging_path) catch {};
        s.free(gpa);
    }

    /// Closes (unlocks) and removes the staging directory, and frees the paths.
    pub fn discard(s: *Staging, gpa: std.mem.Allocator) void {
        s.dir.close();
        std.fs.cwd().deleteTree(s.staging_path) catch {};
        s.free(gpa);
    }

    /// Frees the paths (the directory must be closed already).
    pub fn free(s: *Staging, gpa: std.mem.Allocator) void {
        gpa.free(s.base_path);
        gpa.free(s.dest_path);
        gpa.free(s.staging_path);
        s.* = undefined;
    }
};

/// Renames a complete, fsynced staging directory to `dest_path`. Without `replace` this
/// never replaces anything (renameat2 RENAME_NOREPLACE; "cache path already exists"
/// otherwise). With `replace` an existing destination is exchanged atomically and the old
/// cache, now at `staging_path`, is removed. The caller fsyncs `<base>` next (syncPath).
pub fn renameIntoPlace(staging_path: [:0]const u8, dest_path: [:0]const u8, replace: bool) status.Error!void {
    if (replace) {
        // Swap the new cache in atomically; the old one lands at the staging path.
        const rc = linux.renameat2(posix.AT.FDCWD, staging_path.ptr, posix.AT.FDCWD, dest_path.ptr, rename_exchange);
        switch (linux.E.init(rc)) { // a raw syscall result: not libc-style
            .SUCCESS => {
                // The replaced cache: datasets that still have it open keep reading its open
                // files or get "replaced" errors (cache.zig checks the directory's identity).
                std.fs.cwd().deleteTree(staging_path) catch {};
                return;
            },
            .NOENT => {}, // nothing to replace any more: publish normally
            else => |e| return status.fail(error.Io, "I/O error: {s} (os error {d}): {s}", .{ @tagName(e), @intFromEnum(e), dest_path }),
        }
    }
    const rc = linux.renameat2(posix.AT.FDCWD, staging_path.ptr, posix.AT.FDCWD, dest_path.ptr, rename_noreplace);
    switch (linux.E.init(rc)) { // a raw syscall result: not libc-style
        .SUCCESS => {},
        .EXIST, .NOTEMPTY => return status.fail(error.Exists, "cache path already exists: {s}", .{dest_path}),
        else => |e| return status.fail(error.Io, "I/O error: {s} (os error {d}): {s}", .{ @tagName(e), @intFromEnum(e), dest_path }),
    }
}

/// fsyncs the directory at `path` (after a rename into it).
pub fn syncPath(path: []const u8) status.Error!void {
    var dir = std.fs.cwd().openDir(path, .{ .iterate = true }) catch |err| return status.failIo(err, path);
    defer dir.close();
    posix.fsync(dir.fd) catch |err| return status.failIo(err, path);
}

/// Removes the abandoned staging directories under `<base>/tmp` (see `sweep`);
/// nothing to do when there is no such directory.
pub fn sweepBase(base: []const u8) status.Error!void {
    var base_dir = std.fs.cwd().openDir(base, .{}) catch |err| switch (err) {
        error.FileNotFound => return,
        else => return status.failIo(err, base),
    };
    defer base_dir.close();
    var tmp_dir = base_dir.openDir("tmp", .{ .iterate = true }) catch |err| switch (err) {
        error.FileNotFound => return,
        else => return status.failIo(err, base),
    };
    defer tmp_dir.close();
    sweep(tmp_dir);
}

/// Removes staging directories under `tmp/` whose writers are gone (their lock is free).
pub fn sweep(tmp_dir: std.fs.Dir) void {
    posix.flock(tmp_dir.fd, posix.LOCK.EX) catch return;
    defer posix.flock(tmp_dir.fd, posix.LOCK.UN) catch {};
    var it = tmp_dir.iterate();
    while (it.next() catch null) |entry| {
        if (entry.kind != .directory or !std.mem.endsWith(u8, entry.name, ".drt")) continue;
        var dir = tmp_dir.openDir(entry.name, .{ .iterate = true }) catch continue;
        defer dir.close();
        posix.flock(dir.fd, posix.LOCK.EX | posix.LOCK.NB) catch continue;
        tmp_dir.deleteTree(entry.name) catch {};
    }
}

/// fsyncs the directory `name` inside `parent`.
pub fn syncDir(parent: std.fs.Dir, name: []const u8, where: []const u8) status.Error!void {
    var dir = parent.openDir(name, .{ .iterate = true }) catch |err| return status.failIo(err, where);
    defer dir.close();
    posix.fsync(dir.fd) catch |err| return status.failIo(err, where);
}

pub const Durability = enum { durable, unknown };

/// Publishes `bytes` as `<dir_path>/<name>` atomically: a temporary file in the same
/// directory, written and fsynced, renamed over the target (`replace`) or to a name that
/// must not exist yet (error.Exists otherwise), then the directory fsynced. Returns
/// `.unknown` when only that last fsync failed: the file is in place but may not survive
/// a crash.
pub fn publishFile(gpa: std.mem.Allocator, dir_path: []const u8, name: []const u8, bytes: []const u8, replace: bool) status.Error!Durability {
    if (!manifest.isPlainSegment(name)) return status.fail(error.InvalidArgument, "file name must be a plain path segment", .{});
    var dir = std.fs.cwd().openDir(dir_path, .{ .iterate = true }) catch |err| return status.failIo(err, dir_path);
    defer dir.close();
    var random_bytes: [8]u8 = undefined;
    std.crypto.random.bytes(&random_bytes);
    const prefix_len = @min(name.len, 64);
    const temporary = try std.fmt.allocPrintSentinel(gpa, ".{s}.{s}.tmp", .{ name[0..prefix_len], std.fmt.bytesToHex(random_bytes, .lower) }, 0);
    defer gpa.free(temporary);
    const target = try std.fmt.allocPrintSentinel(gpa, "{s}", .{name}, 0);
    defer gpa.free(target);
    const full = try std.fmt.allocPrint(gpa, "{s}/{s}", .{ std.mem.trimRight(u8, dir_path, "/"), name });
    defer gpa.free(full);
    {
        const file = dir.createFileZ(temporary, .{ .exclusive = true }) catch |err| return status.failIo(err, full);
        defer file.close();
        errdefer dir.deleteFileZ(temporary) catch {};
        file.writeAll(bytes) catch |err| return status.failIo(err, full);
        file.sync() catch |err| return status.failIo(err, full);
    }
    errdefer dir.deleteFileZ(temporary) catch {};
    const flags: u32 = if (replace) 0 else rename_noreplace;
    const rc = linux.renameat2(dir.fd, temporary.ptr, dir.fd, target.ptr, flags);
    switch (linux.E.init(rc)) { // a raw syscall result: not libc-style
        .SUCCESS => {},
        .EXIST => return status.fail(error.Exists, "file already exists: {s}", .{full}),
        else => |e| return status.failErrno(e, full),
    }
    posix.fsync(dir.fd) catch return .unknown;
    return .durable;
}

test "publishFile creates, refuses to replace unless asked, and leaves no temporary file" {
    const gpa = std.testing.allocator;
    var tmp = std.testing.tmpDir(.{ .iterate = true });
    defer tmp.cleanup();
    const dir_path = try tmp.dir.realpathAlloc(gpa, ".");
    defer gpa.free(dir_path);
    try std.testing.expectEqual(Durability.durable, try publishFile(gpa, dir_path, "a.json", "one", false));
    try std.testing.expectError(error.Exists, publishFile(gpa, dir_path, "a.json", "two", false));
    try std.testing.expectEqual(Durability.durable, try publishFile(gpa, dir_path, "a.json", "three", true));
    const text = try tmp.dir.readFileAlloc(gpa, "a.json", 64);
    defer gpa.free(text);
    try std.testing.expectEqualStrings("three", text);
    try std.testing.expectError(error.InvalidArgument, publishFile(gpa, dir_path, "../x", "", false));
    var it = tmp.dir.iterate();
    var names: usize = 0;
    while (try it.next()) |_| names += 1;
    try std.testing.expectEqual(@as(usize, 1), names);
}

test "hashPath and verifyDigest" {
    var tmp = std.testing.tmpDir(.{});
    defer tmp.cleanup();
    try tmp.dir.writeFile(.{ .sub_path = "f", .data = "abc" });
    const gpa = std.testing.allocator;
    const path = try tmp.dir.realpathAlloc(gpa, "f");
    defer gpa.free(path);
    const pathz = try gpa.dupeZ(u8, path);
    defer gpa.free(pathz);
    const d = try hashPath(pathz);
    try std.testing.expectEqual(@as(u64, 3), d.byte_len);
    try verifyDigest(d.sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", path);
    try std.testing.expectError(error.InvalidCache, verifyDigest(d.sha256, "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", path));
}
