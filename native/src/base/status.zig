//! Error model shared by the whole core. Internal functions fail with `Error`, after
//! writing a message into this thread's last-error buffer with `fail`. The C ABI maps each
//! error to one `DRT_E_*` status with an exhaustive switch (`toStatus`), so a new error
//! cannot cross the ABI unmapped. The buffer is the only global mutable state of the
//! library, and it is thread-local as the C ABI requires.

const std = @import("std");

/// Every failure of the core. Each member maps to exactly one C status.
pub const Error = error{
    InvalidArgument,
    InvalidCache,
    Io,
    Json,
    Arrow,
    Index,
    OutOfMemory,
    Forked,
    Exists,
    Overflow,
    Internal,
};

/// C status codes, equal to the `DRT_E_*` constants of dataset_rt.h (append-only).
pub const Status = enum(i32) {
    ok = 0,
    invalid_argument = -1,
    invalid_cache = -2,
    io = -3,
    json = -4,
    arrow = -5,
    index = -6,
    out_of_memory = -7,
    forked = -8,
    exists = -9,
    overflow = -10,
    internal = -11,
};

pub fn toStatus(err: Error) Status {
    return switch (err) {
        error.InvalidArgument => .invalid_argument,
        error.InvalidCache => .invalid_cache,
        error.Io => .io,
        error.Json => .json,
        error.Arrow => .arrow,
        error.Index => .index,
        error.OutOfMemory => .out_of_memory,
        error.Forked => .forked,
        error.Exists => .exists,
        error.Overflow => .overflow,
        error.Internal => .internal,
    };
}

/// Longest message kept; longer messages are truncated on a UTF-8 boundary.
pub const message_bytes_max = 2048;

threadlocal var message_buf: [message_bytes_max + 1]u8 = undefined;
threadlocal var message_len: usize = 0;

/// Records `fmt` as this thread's last error and returns `err`, so call sites read
/// `return status.fail(error.InvalidCache, "missing manifest: {s}", .{path});`.
pub fn fail(err: Error, comptime fmt: []const u8, args: anytype) Error {
    var writer = std.Io.Writer.fixed(message_buf[0..message_bytes_max]);
    writer.print(fmt, args) catch {};
    setLen(writer.end);
    return err;
}

/// Records an already formatted message (copied).
pub fn failText(err: Error, text: []const u8) Error {
    setMessage(text);
    return err;
}

/// Appends ": <path>" to this thread's message, unless it names `path` already
/// (`mentions`), and returns `err`: a record's error then names its shard. When both do
/// not fit the bound, the message is cut (on a UTF-8 boundary, marked "...") so that the
/// path stays whole.
pub fn nameFile(err: Error, path: []const u8) Error {
    const msg = lastMessage();
    if (mentions(msg, path, .file)) return err;
    var copy: [message_bytes_max]u8 = undefined;
    const suffix = ": ".len + path.len;
    if (msg.len + suffix > message_bytes_max and suffix + "...".len < message_bytes_max) {
        const keep = utf8PrefixLen(msg, message_bytes_max - suffix - "...".len);
        @memcpy(copy[0..keep], msg[0..keep]);
        return fail(err, "{s}...: {s}", .{ copy[0..keep], path });
    }
    @memcpy(copy[0..msg.len], msg);
    return fail(err, "{s}: {s}", .{ copy[0..msg.len], path });
}

/// The length of the longest prefix of `bytes` (UTF-8) at most `max` bytes long that does
/// not cut a character in two.
pub fn utf8PrefixLen(bytes: []const u8, max: usize) usize {
    var n = @min(bytes.len, max);
    while (n > 0 and n < bytes.len and (bytes[n] & 0xC0) == 0x80) n -= 1;
    return n;
}

/// Whether `msg` names the file `path` (`.file`) or a file under the directory `path`
/// (`.under`: `path` then a slash) as a path of its own: preceded by the start, a space, a
/// quote or '(', and for `.file` followed by the end or one of ` :,)'"`. A path that only
/// occurs inside other text (`data` in "metadata", `c` in "cache") does not count.
pub fn mentions(msg: []const u8, path: []const u8, how: enum { file, under }) bool {
    if (path.len == 0) return false;
    var from: usize = 0;
    while (std.mem.indexOfPos(u8, msg, from, path)) |at| : (from = at + 1) {
        if (at > 0 and std.mem.indexOfScalar(u8, " '\"(", msg[at - 1]) == null) continue;
        const end = at + path.len;
        switch (how) {
            .under => if (end < msg.len and msg[end] == '/') return true,
            .file => if (end == msg.len or std.mem.indexOfScalar(u8, " :,)'\"", msg[end]) != null) return true,
        }
    }
    return false;
}

/// Replaces this thread's message without failing (for errors raised without one).
pub fn setMessage(text: []const u8) void {
    const n = @min(text.len, message_bytes_max);
    @memcpy(message_buf[0..n], text[0..n]);
    setLen(n);
}

/// Message of the last failure on this thread (NUL-terminated).
pub fn lastMessage() [:0]const u8 {
    message_buf[message_len] = 0;
    return message_buf[0..message_len :0];
}

pub fn clear() void {
    message_len = 0;
}

fn setLen(len: usize) void {
    var n = len;
    // Do not cut a UTF-8 sequence in half: back up to the start of the last one if needed.
    if (n == message_bytes_max) {
        while (n > 0 and (message_buf[n - 1] & 0xC0) == 0x80) n -= 1;
        if (n > 0 and message_buf[n - 1] >= 0xC0) n -= 1;
    }
    message_len = n;
}

/// Formats an OS error like the reference release ("I/O error: <text> (os error N)") and
/// then names the file: "I/O error: No such file or directory (os error 2): <path>".
pub fn failIo(err: anyerror, path: []const u8) Error {
    return fail(error.Io, "I/O error: {s}: {s}", .{ describeOsError(err), path });
}

/// An I/O failure reported as an errno (io_uring completions, the I/O layer's reads), in
/// the same words as `failIo`.
pub fn failErrno(e: std.posix.E, path: []const u8) Error {
    const text = errnoText(e) orelse "OS error";
    return fail(error.Io, "I/O error: {s} (os error {d}): {s}", .{ text, @intFromEnum(e), path });
}

/// The C library's text of the errnos file operations meet (the reference release prints
/// Rust's, which are the same), the one table both `failErrno` and `describeOsError` use.
const errno_texts = [_]struct { std.posix.E, []const u8 }{
    .{ .NOENT, "No such file or directory" },
    .{ .ACCES, "Permission denied" },
    .{ .PERM, "Operation not permitted" },
    .{ .IO, "Input/output error" },
    .{ .NXIO, "No such device or address" },
    .{ .BADF, "Bad file descriptor" },
    .{ .AGAIN, "Resource temporarily unavailable" },
    .{ .NOMEM, "Cannot allocate memory" },
    .{ .BUSY, "Device or resource busy" },
    .{ .EXIST, "File exists" },
    .{ .NODEV, "No such device" },
    .{ .NOTDIR, "Not a directory" },
    .{ .ISDIR, "Is a directory" },
    .{ .INVAL, "Invalid argument" },
    .{ .NFILE, "Too many open files in system" },
    .{ .MFILE, "Too many open files" },
    .{ .TXTBSY, "Text file busy" },
    .{ .FBIG, "File too large" },
    .{ .NOSPC, "No space left on device" },
    .{ .SPIPE, "Illegal seek" },
    .{ .ROFS, "Read-only file system" },
    .{ .MLINK, "Too many links" },
    .{ .PIPE, "Broken pipe" },
    .{ .NAMETOOLONG, "File name too long" },
    .{ .NOTEMPTY, "Directory not empty" },
    .{ .LOOP, "Too many levels of symbolic links" },
    .{ .OVERFLOW, "Value too large for defined data type" },
    .{ .CONNRESET, "Connection reset by peer" },
    .{ .STALE, "Stale file handle" },
    .{ .DQUOT, "Disk quota exceeded" },
};

fn errnoText(e: std.posix.E) ?[]const u8 {
    inline for (errno_texts) |entry| if (e == entry[0]) return entry[1];
    return null;
}

/// "<text> (os error N)" of an errno of the table, built at compile time.
fn describeErrno(comptime e: std.posix.E) []const u8 {
    const text = comptime errnoText(e) orelse @compileError("errno without a text: " ++ @tagName(e));
    return std.fmt.comptimePrint("{s} (os error {d})", .{ text, @intFromEnum(e) });
}

/// Human text for the std error names that file operations return.
pub fn describeOsError(err: anyerror) []const u8 {
    return switch (err) {
        error.FileNotFound => describeErrno(.NOENT),
        error.AccessDenied, error.PermissionDenied => describeErrno(.ACCES),
        error.NotDir => describeErrno(.NOTDIR),
        error.IsDir => describeErrno(.ISDIR),
        error.NoSpaceLeft => describeErrno(.NOSPC),
        error.NameTooLong => describeErrno(.NAMETOOLONG),
        error.PathAlreadyExists => describeErrno(.EXIST),
        error.DirNotEmpty => describeErrno(.NOTEMPTY),
        error.DiskQuota => describeErrno(.DQUOT),
        error.ProcessFdQuotaExceeded => describeErrno(.MFILE),
        error.SystemFdQuotaExceeded => describeErrno(.NFILE),
        error.InputOutput => describeErrno(.IO),
        error.ReadOnlyFileSystem => describeErrno(.ROFS),
        error.SymLinkLoop => describeErrno(.LOOP),
        error.FileTooBig => describeErrno(.FBIG),
        error.SystemResources, error.OutOfMemory => describeErrno(.NOMEM),
        error.DeviceBusy => describeErrno(.BUSY),
        error.FileBusy => describeErrno(.TXTBSY),
        error.WouldBlock => describeErrno(.AGAIN),
        error.NoDevice => describeErrno(.NODEV),
        error.NotOpenForReading, error.NotOpenForWriting => describeErrno(.BADF),
        error.InvalidArgument => describeErrno(.INVAL),
        error.Unseekable => describeErrno(.SPIPE),
        error.LinkQuotaExceeded => describeErrno(.MLINK),
        error.BrokenPipe => describeErrno(.PIPE),
        error.ConnectionResetByPeer => describeErrno(.CONNRESET),
        error.BadPathName, error.InvalidUtf8 => "invalid path name",
        error.EndOfStream, error.ShortRead => "failed to fill whole buffer",
        error.Unexpected => "unexpected error from the operating system",
        // Any other error the std library names: its name, not an errno text.
        else => @errorName(err),
    };
}

test "OS errors are described in the reference's words" {
    try std.testing.expectEqualStrings("File too large (os error 27)", describeOsError(error.FileTooBig));
    try std.testing.expectEqualStrings("Cannot allocate memory (os error 12)", describeOsError(error.SystemResources));
    try std.testing.expectEqual(error.Io, failErrno(.FBIG, "a/shards/000000.bin"));
    try std.testing.expectEqualStrings("I/O error: File too large (os error 27): a/shards/000000.bin", lastMessage());
    // Both paths take their words from one table.
    try std.testing.expectEqual(error.Io, failErrno(.NAMETOOLONG, "x"));
    try std.testing.expectEqualStrings("I/O error: File name too long (os error 36): x", lastMessage());
    try std.testing.expectEqualStrings("File name too long (os error 36)", describeOsError(error.NameTooLong));
    try std.testing.expectEqual(error.Io, failErrno(.XDEV, "x"));
    try std.testing.expectEqualStrings("I/O error: OS error (os error 18): x", lastMessage());
}

test "fail records the message and returns the error" {
    const e = fail(error.InvalidCache, "missing manifest: {s}/manifest.json", .{"a/b"});
    try std.testing.expectEqual(error.InvalidCache, e);
    try std.testing.expectEqualStrings("missing manifest: a/b/manifest.json", lastMessage());
    try std.testing.expectEqual(Status.invalid_cache, toStatus(e));
}

test "nameFile appends the path once" {
    try std.testing.expectEqual(error.InvalidCache, fail(error.InvalidCache, "invalid binary record", .{}));
    try std.testing.expectEqual(error.InvalidCache, nameFile(error.InvalidCache, "c/shards/000000.bin"));
    try std.testing.expectEqualStrings("invalid binary record: c/shards/000000.bin", lastMessage());
    try std.testing.expectEqual(error.InvalidCache, nameFile(error.InvalidCache, "c/shards/000000.bin"));
    try std.testing.expectEqualStrings("invalid binary record: c/shards/000000.bin", lastMessage());
}

test "nameFile keeps the path whole when the message is long" {
    var long: [message_bytes_max]u8 = undefined;
    @memset(&long, 'x');
    // "é" right across where the message is cut for this path (2048 - 28 - 3 = 2017).
    long[2016] = 0xC3;
    long[2017] = 0xA9;
    try std.testing.expectEqual(error.InvalidCache, fail(error.InvalidCache, "{s}", .{long[0 .. message_bytes_max - 10]}));
    const path = "/some/cache/metadata.arrow";
    try std.testing.expectEqual(error.InvalidCache, nameFile(error.InvalidCache, path));
    const msg = lastMessage();
    try std.testing.expect(std.mem.endsWith(u8, msg, "...: " ++ path));
    try std.testing.expect(msg.len <= message_bytes_max);
    try std.testing.expect(std.unicode.utf8ValidateSlice(msg));
}

test "mentions: a path of its own, not text that contains it" {
    const msg = "embedded metadata field 'name' is missing";
    try std.testing.expect(!mentions(msg, "data", .under));
    try std.testing.expect(!mentions(msg, "data", .file));
    try std.testing.expect(!mentions(msg, "a", .file));
    try std.testing.expect(!mentions("cache replaced: cache2/shards/000000.bin", "cache", .under));
    try std.testing.expect(mentions("checksum mismatch for data/metadata.arrow", "data", .under));
    try std.testing.expect(mentions("invalid record: c/shards/000000.bin", "c/shards/000000.bin", .file));
    try std.testing.expect(mentions("I/O error (os error 2): /x/c/index.bin: more", "/x/c/index.bin", .file));
    try std.testing.expect(!mentions("see c/shards/000000.bin.tmp", "c/shards/000000.bin", .file));
    try std.testing.expect(!mentions("anything", "", .file));
}

test "long messages are truncated on a UTF-8 boundary" {
    var text: [message_bytes_max + 10]u8 = undefined;
    var i: usize = 0;
    while (i + 2 <= text.len) : (i += 2) {
        text[i] = 0xC3;
        text[i + 1] = 0xA9; // é
    }
    try std.testing.expectEqual(error.Io, failText(error.Io, text[0..i]));
    try std.testing.expect(std.unicode.utf8ValidateSlice(lastMessage()));
}
