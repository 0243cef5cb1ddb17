"""Every input of one prediction, validated and resolved; what-if knobs."""
