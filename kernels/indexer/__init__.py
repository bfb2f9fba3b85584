"""Lightning indexer of MiniMax M3 sparse attention: block-max scores and top-k block selection."""
