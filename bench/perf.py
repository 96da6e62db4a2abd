"""Performance suite placeholder until the benchmark issue lands."""

if __name__ == "__main__":
    print("no benchmarks yet")
