"""What every layer uses: user errors, input checks, files, progress bars, TOML."""
