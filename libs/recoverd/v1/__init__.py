"""Generated protobuf code (make proto); do not edit."""
