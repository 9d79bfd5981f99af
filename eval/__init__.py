"""The eval harness: timm model loading, streamed inference to per-image predictions, metrics."""
