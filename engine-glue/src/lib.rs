//! What a storage engine links (filled by the engine-glue issue).
