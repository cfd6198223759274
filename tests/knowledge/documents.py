"""Small real-looking documents for the sentence splitter and extractive answers: Markdown
documentation with headings, lists, code, a table and a quote; an HTML documentation page
(with navigation, a numbered listing and a table) that the parser turns into text; and text as
pypdf extracts it from a paper (hard line breaks, hyphenation, page numbers, run-in headings,
a flattened table)."""

MARKDOWN_GUIDE = """\
# Installing Frobnicator

Frobnicator is a command-line tool for frobnicating large files. It was written by
the Acme tools team in 2019 and is maintained by Dana Whitfield.

## Requirements

- Python 3.11 or newer
- A POSIX shell
- 2 GB of free disk space. More is better for large inputs.

## Steps

1. Download the release archive.
2. Unpack it with `tar xzf frob.tar.gz`.
3. Run the installer:

```sh
./install.sh --prefix /usr/local
# Installing into /usr/local.
```

The installer copies the binary into `bin/` and writes a default configuration file.
It never overwrites an existing configuration.

| Option | Default | Meaning |
|--------|---------|---------|
| --prefix | /usr/local | Where to install. |
| --quiet | off | Print nothing. |

> Note: the installer needs write access to the prefix.
> Run it with sudo when installing system-wide.

Frobnicator reads its configuration from `~/.frobrc`. The file uses the INI format, e.g. `threads = 4`.
"""

HTML_PAGE = """\
<html><head><title>Debian Reference: Package management</title><style>body{}</style></head><body>
<div class="navheader"><table><tr><td>Previous</td><td>Up</td><td>Next</td></tr></table></div>
<h1>Chapter 2. Debian package management</h1>
<h2>2.1. Debian package management prerequisites</h2>
<p>Debian is a volunteer organization which builds consistent distributions of pre-compiled binary packages of
free software and distributes them from its archive. The Debian archive is offered by many remote mirror sites
for access through HTTP and FTP methods.</p>
<p>The apt-get command was the first tool to handle dependencies. The aptitude command was created later and
offers a full-screen interactive interface. The apt command was introduced in Debian 8 (Jessie) as a
friendlier front end for interactive use.</p>
<h3>2.1.1. Package configuration</h3>
<ul>
<li>Use apt for interactive package management.</li>
<li>Use apt-get and apt-cache in scripts.</li>
<li>pin packages carefully</li>
</ul>
<p>Package configuration is stored in /etc/apt/sources.list and in files under /etc/apt/sources.list.d/. Each
line names an archive, a suite and its components.</p>
<pre class="screen">
 1  $ sudo apt update
 2  $ sudo apt install foo
 3  $ apt-cache policy foo
</pre>
<table><tr><th>command</th><th>action</th></tr>
<tr><td>apt update</td><td>update package archive metadata</td></tr>
<tr><td>apt install foo</td><td>install candidate version of "foo" package with its dependencies</td></tr>
</table>
<h2>2.2. Basic package management operations</h2>
<p>Repository-based package management operations on the Debian system can be performed by many package
management tools available on the Debian system. The apt-get command removes a package with the remove
subcommand, and the purge subcommand also deletes its configuration files.</p>
<p>The dpkg command installs a local package file and never resolves dependencies. Unlike apt, dpkg works only
on packages already downloaded to the system.</p>
<div class="navfooter">Previous | Up | Next | Home</div>
</body></html>
"""

PDF_TEXT = """\
LightRAG: Simple and Fast Retrieval-Augmented Generation
Zirui Guo, Lianghao Xia, Yanhua Yu, Tu Ao, Chao Huang
University of Hong Kong
Abstract
Retrieval-Augmented Generation (RAG) systems enhance large language models (LLMs)
by integrating external knowledge sources. Existing RAG systems have significant lim-
itations, including a reliance on flat data representations and inadequate contextual
awareness. To address these challenges, we propose LightRAG, which incorporates graph
structures into text indexing and retrieval processes.
1
1 Introduction
Retrieval-Augmented Generation systems have been developed to enhance large language
models by integrating external knowledge sources. LightRAG was developed at the Uni-
versity of Hong Kong by the data intelligence lab led by Chao Huang. The framework
employs a dual-level retrieval system that enhances comprehensive information retrieval
from both low-level and high-level knowledge discovery.
2 Retrieval-Augmented Generation
2.1 Graph-based Text Indexing
Graph-Enhanced Entity and Relationship Extraction. Our LightRAG enhances the retrieval
system by segmenting documents into smaller and more manageable pieces. This strategy
allows for quick identification and access to pertinent information without analyzing
entire documents. Next, we leverage LLMs to identify and extract various entities (e.g.,
names, dates, locations, and events) along with the relationships between them.
Table 1: Statistics of the four datasets.
Statistics Agriculture CS Legal Mix
Total Documents 12 10 94 61
Total Tokens 2,017,886 2,306,535 5,081,069 619,009
2
Fast Adaptation to Incremental Knowledge Base. To efficiently adapt to evolving data
changes while ensuring accurate and relevant responses, LightRAG incrementally updates
the knowledge base without reprocessing the entire external database. The incremental
update algorithm processes new documents with the same graph-based indexing steps as
before, and then merges the new graph with the original one.
"""
