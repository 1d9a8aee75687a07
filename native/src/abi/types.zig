//! Zig mirrors of the structs and constants of dataset_rt.h (the C types: only abi/ uses them). The header is the source of
//! truth; the test at the bottom compiles the header with @cImport and checks that sizes,
//! field offsets and constants agree, so the two cannot drift apart.

const std = @import("std");

pub const Str = extern struct {
    ptr: ?[*]const u8,
    len: u64,

    pub fn slice(s: Str) []const u8 {
        const p = s.ptr orelse return &.{};
        return p[0..@intCast(s.len)];
    }

    pub fn from(bytes: []const u8) Str {
        return .{ .ptr = bytes.ptr, .len = bytes.len };
    }
};

pub const Field = extern struct {
    name: Str,
    kind: i32,
    reserved: u32,
};

pub const Column = extern struct {
    kind: i32,
    reserved: u32,
    values: ?*const anyopaque,
    offsets: ?[*]const u64,
};

pub const WriterOptions = extern struct {
    max_shard_bytes: u64,
    prefetch_size: u64,
    compression: i32,
    flags: u32,
    compression_ratio: f64,
    fingerprint: ?[*]const u8,
    fingerprint_len: u64,
};

pub const writer_profile: u32 = 1;
pub const writer_replace: u32 = 2;
pub const writer_metadata: u32 = 4;

pub const StageStats = extern struct {
    calls: u64 = 0,
    total_ns: u64 = 0,
    bytes: u64 = 0,
};

pub const DatasetOptions = extern struct {
    seed: u64,
    prefetch_size: u64,
    shuffle: i32,
    validate_cache: i32,
    io_backend: i32,
    sampling: i32,
};

pub const sampling_with_replacement = 0;
pub const sampling_permutation = 1;

pub const CacheInfo = extern struct {
    cache_id: u64,
    sample_count: u64,
    shard_count: u64,
    format_version: u32,
    compression: i32,
    compression_ratio: f64,
    source_name: Str,
    path: Str,
    fingerprint: Str,
};

pub const Batch = extern struct {
    count: u64,
    payloads: ?[*]const [*]const u8,
    payload_lens: ?[*]const u64,
    payload_base: ?[*]const u8,
    payload_offsets: ?[*]const u64,
    cache_ids: ?[*]const u64,
    sample_ids: ?[*]const u64,
    columns: ?[*]const Column,
};

pub const TableColumn = extern struct {
    type: i32,
    reserved: u32,
    values: ?*const anyopaque,
    validity: ?[*]const u8,
    offset: u64,
};

pub const type_other = 0;
pub const type_u64 = 1;
pub const type_u32 = 2;
pub const type_i64 = 3;
pub const type_i32 = 4;
pub const type_f64 = 5;
pub const type_f32 = 6;

pub const IoStats = extern struct {
    uring_reads: u64 = 0,
    pool_reads: u64 = 0,
    lookup_reads: u64 = 0,
    bytes_read: u64 = 0,
};

pub const Stream = extern struct {
    position: u64,
    window_end: u64,
};

pub const IterRange = extern struct {
    start: u64,
    count: u64,
    block_len: u64,
    block_stride: u64,
};

pub const abi_version_major = 1;
pub const abi_version_minor = 18;

/// drt_iter_give_payload_buffers: drop the buffers not yet assigned first.
pub const payload_buffers_reset: u32 = 1;

/// drt_manifest_entry.
pub const ManifestEntry = extern struct {
    path: Str,
    cache_id: u64,
    outcome: i32,
    reserved: u32,
};

pub const migrate_unchanged = 0;
pub const migrate_updated = 1;
pub const migrate_durability_unknown = 2;
pub const publish_replace: u32 = 1;

/// drt_iter_next_batch / drt_lookup_get flags.
pub const batch_contiguous: u32 = 1;
pub const batch_stored_metadata: u32 = 2;
pub const batch_bounded: u32 = 4;

pub const io_auto = 0;
pub const io_uring = 1;
pub const io_threads = 2;

test "structs and constants match dataset_rt.h" {
    const c = @cImport(@cInclude("dataset_rt.h"));
    const pairs = .{
        .{ Str, c.drt_str },
        .{ Field, c.drt_field },
        .{ Column, c.drt_column },
        .{ WriterOptions, c.drt_writer_options },
        .{ DatasetOptions, c.drt_dataset_options },
        .{ CacheInfo, c.drt_cache_info },
        .{ Batch, c.drt_batch },
        .{ TableColumn, c.drt_table_column },
        .{ StageStats, c.drt_stage_stats },
        .{ IoStats, c.drt_io_stats },
        .{ Stream, c.drt_stream },
        .{ IterRange, c.drt_iter_range },
        .{ ManifestEntry, c.drt_manifest_entry },
        .{ RemoteOptions, c.drt_remote_options },
        .{ remote.Ops, c.drt_remote_ops },
    };
    inline for (pairs) |pair| {
        const Z = pair[0];
        const C = pair[1];
        try std.testing.expectEqual(@sizeOf(C), @sizeOf(Z));
        inline for (std.meta.fields(Z)) |f| {
            try std.testing.expectEqual(@offsetOf(C, f.name), @offsetOf(Z, f.name));
        }
    }
    const status = @import("../base/status.zig");
    inline for (std.meta.fields(status.Status)) |f| {
        const c_name = comptime blk: {
            if (std.mem.eql(u8, f.name, "ok")) break :blk "DRT_OK";
            var upper: [f.name.len]u8 = undefined;
            _ = std.ascii.upperString(&upper, f.name);
            break :blk "DRT_E_" ++ upper;
        };
        try std.testing.expectEqual(@as(i64, f.value), @as(i64, @field(c, c_name)));
    }
    const schema = @import("../format/schema.zig");
    try std.testing.expectEqual(@as(i64, @intFromEnum(schema.Kind.bool)), c.DRT_KIND_BOOL);
    try std.testing.expectEqual(@as(i64, @intFromEnum(schema.Kind.int)), c.DRT_KIND_INT);
    try std.testing.expectEqual(@as(i64, @intFromEnum(schema.Kind.float)), c.DRT_KIND_FLOAT);
    try std.testing.expectEqual(@as(i64, @intFromEnum(schema.Kind.string)), c.DRT_KIND_STRING);
    try std.testing.expectEqual(@as(i64, abi_version_major), c.DRT_ABI_VERSION_MAJOR);
    try std.testing.expectEqual(@as(i64, abi_version_minor), c.DRT_ABI_VERSION_MINOR);
    try std.testing.expectEqual(@as(i64, io_auto), c.DRT_IO_AUTO);
    try std.testing.expectEqual(@as(i64, io_uring), c.DRT_IO_URING);
    try std.testing.expectEqual(@as(i64, batch_contiguous), c.DRT_BATCH_CONTIGUOUS);
    try std.testing.expectEqual(@as(i64, batch_stored_metadata), c.DRT_BATCH_STORED_METADATA);
    try std.testing.expectEqual(@as(i64, batch_bounded), c.DRT_BATCH_BOUNDED);
    try std.testing.expectEqual(@as(i64, payload_buffers_reset), c.DRT_PAYLOAD_BUFFERS_RESET);
    try std.testing.expectEqual(@as(i64, migrate_unchanged), c.DRT_MIGRATE_UNCHANGED);
    try std.testing.expectEqual(@as(i64, migrate_updated), c.DRT_MIGRATE_UPDATED);
    try std.testing.expectEqual(@as(i64, migrate_durability_unknown), c.DRT_MIGRATE_DURABILITY_UNKNOWN);
    try std.testing.expectEqual(@as(i64, publish_replace), c.DRT_PUBLISH_REPLACE);
    try std.testing.expectEqual(@as(i64, io_threads), c.DRT_IO_THREADS);
    try std.testing.expectEqual(@as(i64, 1), c.DRT_COMPRESSION_LZ4);
    try std.testing.expectEqual(@as(i64, type_u64), c.DRT_TYPE_U64);
    try std.testing.expectEqual(@as(i64, type_f32), c.DRT_TYPE_F32);
    try std.testing.expectEqual(@as(i64, type_other), c.DRT_TYPE_OTHER);
    try std.testing.expectEqual(@as(i64, writer_profile), c.DRT_WRITER_PROFILE);
    try std.testing.expectEqual(@as(i64, writer_metadata), c.DRT_WRITER_METADATA);
    try std.testing.expectEqual(@as(i64, sampling_permutation), c.DRT_SAMPLING_PERMUTATION);
    inline for (std.meta.fields(remote.Code)) |f| {
        const c_name = comptime blk: {
            var upper: [f.name.len]u8 = undefined;
            _ = std.ascii.upperString(&upper, f.name);
            break :blk "DRT_REMOTE_" ++ upper;
        };
        try std.testing.expectEqual(@as(i64, f.value), @as(i64, @field(c, c_name)));
    }
    const Stage = @import("../write/writer.zig").Stage;
    try std.testing.expectEqual(@as(i64, std.meta.fields(Stage).len), c.DRT_STAGE_COUNT);
    try std.testing.expectEqual(@as(i64, @intFromEnum(Stage.publish)), c.DRT_STAGE_PUBLISH);
    try std.testing.expectEqual(@as(i64, @intFromEnum(Stage.finish_metadata)), c.DRT_STAGE_FINISH_METADATA);
}

// ---- caches on object storage

const remote = @import("../io/remote.zig");

/// drt_remote_options (the ops table is `remote.Ops`).
pub const RemoteOptions = extern struct {
    ops: remote.Ops,
    cache_dir: Str,
    budget_bytes: u64,
    retries: u32,
    reserved: u32,
};

// ---- fragments

/// drt_commit_options.
pub const CommitOptions = extern struct {
    flags: u32 = 0,
    reserved: u32 = 0,
};

pub const commit_replace: u32 = 1;

test "fragment structs and constants match dataset_rt.h" {
    const c = @cImport(@cInclude("dataset_rt.h"));
    try std.testing.expectEqual(@sizeOf(c.drt_commit_options), @sizeOf(CommitOptions));
    inline for (std.meta.fields(CommitOptions)) |f| {
        try std.testing.expectEqual(@offsetOf(c.drt_commit_options, f.name), @offsetOf(CommitOptions, f.name));
    }
    try std.testing.expectEqual(@as(i64, commit_replace), c.DRT_COMMIT_REPLACE);
}

test "structs keep their size within ABI major 1 (a program built against 1.1 or later runs with any later 1.x)" {
    const c = @cImport(@cInclude("dataset_rt.h"));
    // Sizes since ABI 1.1 (1.1 added the fingerprint fields, growing drt_writer_options
    // and drt_cache_info). A struct that must grow needs a new function or ABI 2.
    const sizes = .{
        .{ c.drt_str, 16 },            .{ c.drt_field, 24 },        .{ c.drt_column, 24 },
        .{ c.drt_writer_options, 48 }, .{ c.drt_stage_stats, 24 },  .{ c.drt_dataset_options, 32 },
        .{ c.drt_cache_info, 88 },     .{ c.drt_remote_ops, 32 },   .{ c.drt_remote_options, 64 },
        .{ c.drt_io_stats, 32 },       .{ c.drt_table_column, 32 }, .{ c.drt_stream, 16 },
        .{ c.drt_batch, 64 },          .{ c.drt_iter_range, 32 },   .{ c.drt_commit_options, 8 },
        .{ c.drt_manifest_entry, 32 },
    };
    inline for (sizes) |entry| try std.testing.expectEqual(@as(usize, entry[1]), @sizeOf(entry[0]));
}
