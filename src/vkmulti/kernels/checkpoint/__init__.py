"""Kernel checkpoints as data: the binary format, its header and chunk types, and the storages."""
from .format import (CHECKPOINT_MAGIC, CHECKPOINT_VERSION, MAX_CHECKPOINT_SIZE, FLAG_CHUNK_CRC32, FLAG_HEADER_CRC32,
                     DELTA_PARENT_DIGEST_KEY, ChunkType, ChunkHeader, CheckpointHeader, CheckpointMetadata,
                     DataChunk, Checkpoint, CheckpointBuilder, chunk_name_id, crc32)
from .header import (CHECKPOINT_MAGIC, CHECKPOINT_VERSION, MAX_CHECKPOINT_SIZE, FLAG_CHUNK_CRC32, FLAG_HEADER_CRC32,
                     HEADER_SIZE, CHUNK_HEADER_SIZE, DELTA_PARENT_DIGEST_KEY, ChunkType, ChunkHeader,
                     CheckpointHeader, CheckpointMetadata, chunk_name_id, crc32, as_bytes)
from .storage import CheckpointStorage, MemoryStorage, FileStorage, check_checkpoint_name

__all__ = ["CHECKPOINT_MAGIC", "CHECKPOINT_VERSION", "MAX_CHECKPOINT_SIZE", "FLAG_CHUNK_CRC32", "FLAG_HEADER_CRC32",
           "DELTA_PARENT_DIGEST_KEY", "ChunkType", "ChunkHeader", "CheckpointHeader", "CheckpointMetadata",
           "DataChunk", "Checkpoint", "CheckpointBuilder", "chunk_name_id", "crc32", "HEADER_SIZE",
           "CHUNK_HEADER_SIZE", "as_bytes", "CheckpointStorage", "MemoryStorage", "FileStorage",
           "check_checkpoint_name"]
