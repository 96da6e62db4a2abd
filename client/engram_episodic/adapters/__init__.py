"""Framework adapters: Engram's tool set and memory nodes for LangChain, LangGraph and the OpenAI Agents SDK.

    from engram_episodic.adapters.langchain import engram_tools            # extra: langchain
    from engram_episodic.adapters.langgraph import context_node, record_node  # extra: langgraph
    from engram_episodic.adapters.openai_agents import engram_function_tools  # extra: openai-agents

Each module imports its framework when it is imported, never before: importing `engram_episodic` (or
this package) needs none of them. The tools are the ones `engram_episodic.tools` defines (names,
descriptions, JSON schemas, result texts); the adapters only wrap them in each framework's tool type.
docs/integrations.md has copy-paste examples and says why there is no LangGraph `BaseStore` over Engram.
"""
