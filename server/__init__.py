"""The ServerApp: run config to strategy and initial models, results files."""
