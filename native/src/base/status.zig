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

/// Appends ": <path>" to this thread's message (cut at the bound as `fail` cuts), unless
/// it names `path` already, and returns `err`: a record's error then names its shard.
pub fn nameFile(err: Error, path: []const u8) Error {
    const msg = lastMessage();
    if (std.mem.indexOf(u8, msg, path) != null) return err;
    var copy: [message_bytes_max]u8 = undefined;
    @memcpy(copy[0..msg.len], msg);
    return fail(err, "{s}: {s}", .{ copy[0..msg.len], path });
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
    const text = switch (e) {
        .NOENT => "No such file or directory",
        .ACCES, .PERM => "Permission denied",
        .IO => "Input/output error",
        .ISDIR => "Is a directory",
        .BADF => "Bad file descriptor",
        .NOMEM => "Cannot allocate memory",
        .INVAL => "Invalid argument",
        .NOSPC => "No space left on device",
        .FBIG => "File too large",
        .ROFS => "Read-only file system",
        .DQUOT => "Disk quota exceeded",
        .MFILE, .NFILE => "Too many open files",
        .AGAIN => "Resource temporarily unavailable",
        .BUSY => "Device or resource busy",
        .NXIO => "No such device or address",
        .NODEV => "No such device",
        .NOTDIR => "Not a directory",
        .OVERFLOW => "Value too large for defined data type",
        .STALE => "Stale file handle",
        else => "OS error",
    };
    return fail(error.Io, "I/O error: {s} (os error {d}): {s}", .{ text, @intFromEnum(e), path });
}

/// Human text for the std error names that file operations return.
pub fn describeOsError(err: anyerror) []const u8 {
    return switch (err) {
        error.FileNotFound => "No such file or directory (os error 2)",
        error.AccessDenied, error.PermissionDenied => "Permission denied (os error 13)",
        error.NotDir => "Not a directory (os error 20)",
        error.IsDir => "Is a directory (os error 21)",
        error.NoSpaceLeft => "No space left on device (os error 28)",
        error.NameTooLong => "File name too long (os error 36)",
        error.PathAlreadyExists => "File exists (os error 17)",
        error.DirNotEmpty => "Directory not empty (os error 39)",
        error.DiskQuota => "Disk quota exceeded (os error 122)",
        error.ProcessFdQuotaExceeded, error.SystemFdQuotaExceeded => "Too many open files (os error 24)",
        error.InputOutput => "Input/output error (os error 5)",
        error.ReadOnlyFileSystem => "Read-only file system (os error 30)",
        error.SymLinkLoop => "Too many levels of symbolic links (os error 40)",
        error.BadPathName, error.InvalidUtf8 => "invalid path name",
        error.EndOfStream, error.ShortRead => "failed to fill whole buffer",
        error.FileTooBig => "File too large (os error 27)",
        error.SystemResources, error.OutOfMemory => "Cannot allocate memory (os error 12)",
        error.DeviceBusy => "Device or resource busy (os error 16)",
        error.FileBusy => "Text file busy (os error 26)",
        error.WouldBlock => "Resource temporarily unavailable (os error 11)",
        error.NoDevice => "No such device (os error 19)",
        error.NotOpenForReading, error.NotOpenForWriting => "Bad file descriptor (os error 9)",
        error.InvalidArgument => "Invalid argument (os error 22)",
        error.Unseekable => "Illegal seek (os error 29)",
        error.LinkQuotaExceeded => "Too many links (os error 31)",
        error.BrokenPipe => "Broken pipe (os error 32)",
        error.ConnectionResetByPeer => "Connection reset by peer (os error 104)",
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
    try std.testing.expectEqual(error.Io, failErrno(.PIPE, "x"));
    try std.testing.expectEqualStrings("I/O error: OS error (os error 32): x", lastMessage());
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
