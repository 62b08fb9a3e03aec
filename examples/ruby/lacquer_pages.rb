# Write whole pages into Lacquer's shared memcached tier, so Lacquer serves them without asking the
# application (the format is docs/entry-format.md). Needs only a memcached client: Dalli.
#
#   writer = LacquerPages::Writer.new(["10.0.0.1:11211", "10.0.0.2:11211"]) # as Lacquer lists them
#   writer.write("shop.example", "/products?id=7", "<html>...", max_age: 300,
#                headers: [["Content-Type", "text/html"], ["Surrogate-Key", "product-7"]])
#   writer.delete("shop.example", "/products?id=7")
#
# The host is the Host header the client sends (lowercased, with the port when it sends one); the
# path includes the query exactly as sent. Nodes keep a copy they read for their local_ttl: to
# replace a page everywhere at once, purge it (admin API) first, then write it.
require "dalli"
require "digest/md5"
require "zlib"

module LacquerPages
  # BLAKE2b with a 16-byte digest (RFC 7693): Ruby's standard library has no BLAKE2b-128, and
  # it is not a truncated BLAKE2b-512 (the length is part of the parameters).
  module Blake2b128
    MASK = 0xffff_ffff_ffff_ffff
    IV = [0x6a09e667f3bcc908, 0xbb67ae8584caa73b, 0x3c6ef372fe94f82b, 0xa54ff53a5f1d36f1,
          0x510e527fade682d1, 0x9b05688c2b3e6c1f, 0x1f83d9abfb41bd6b, 0x5be0cd19137e2179].freeze
    SIGMA = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
             [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
             [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
             [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
             [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
             [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
             [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
             [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
             [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
             [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0]].freeze

    def self.rotr(x, n) = ((x >> n) | (x << (64 - n))) & MASK

    def self.mix(v, a, b, c, d, x, y)
      v[a] = (v[a] + v[b] + x) & MASK; v[d] = rotr(v[d] ^ v[a], 32)
      v[c] = (v[c] + v[d]) & MASK;     v[b] = rotr(v[b] ^ v[c], 24)
      v[a] = (v[a] + v[b] + y) & MASK; v[d] = rotr(v[d] ^ v[a], 16)
      v[c] = (v[c] + v[d]) & MASK;     v[b] = rotr(v[b] ^ v[c], 63)
    end

    def self.compress(h, block, counter, last)
      m = block.unpack("Q<16")
      v = h + IV
      v[12] ^= counter & MASK
      v[13] ^= counter >> 64
      v[14] ^= MASK if last
      12.times do |round|
        s = SIGMA[round % 10]
        [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15],
         [0, 5, 10, 15], [1, 6, 11, 12], [2, 7, 8, 13], [3, 4, 9, 14]].each_with_index do |(a, b, c, d), i|
          mix(v, a, b, c, d, m[s[2 * i]], m[s[2 * i + 1]])
        end
      end
      8.times { |i| h[i] ^= v[i] ^ v[i + 8] }
    end

    def self.hexdigest(data)
      data = data.b
      h = IV.dup
      h[0] ^= 0x01010000 ^ 16 # no key, 16-byte digest
      blocks = [data.bytesize, 1].max.fdiv(128).ceil
      blocks.times do |i|
        chunk = data.byteslice(i * 128, 128) || ""
        compress(h, chunk.ljust(128, "\0"), [i * 128 + chunk.bytesize, data.bytesize].min, i == blocks - 1)
      end
      h.pack("Q<8")[0, 16].unpack1("H*")
    end
  end

  # libmemcached's weighted ketama (MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED), as Lacquer places keys.
  # Dalli places keys its own way, so one single-server Dalli client is used per server.
  class KetamaRing
    def initialize(servers, weights = nil)
      weights = (weights || [1] * servers.size).map { |w| [w, 1].max }
      f32 = ->(x) { [x].pack("f").unpack1("f") }
      @servers, @points = servers, []
      servers.each_with_index do |name, index|
        host, port = name.split(/:(?=\d+\z)/)
        label = port == "11211" ? host : name # libmemcached leaves the default port out
        pct = f32.(f32.(weights[index].to_f) / f32.(weights.sum.to_f))
        f32.(f32.(f32.(pct * 160.0) / 4.0) * f32.(servers.size.to_f)).floor.times do |j|
          Digest::MD5.digest("#{label}-#{j}").unpack("V4").each { |point| @points << [point, index] }
        end
      end
      @points.sort!
    end

    def server_for(key)
      hash = Digest::MD5.digest(key).unpack1("V")
      point = @points.bsearch { |p, _| p >= hash } || @points.first
      @servers[point[1]]
    end
  end

  def self.primary_key(host, path) = host.downcase + path

  def self.memcached_key(host, path, namespace = "lq")
    "#{namespace}:#{Blake2b128.hexdigest(primary_key(host, path))}"
  end

  # A complete entry (kind 1): head, freshness and body, sealed with a CRC-32.
  def self.encode_page(logical_key, body, status: 200, headers: [], max_age: 300, swr: 0, sie: 0)
    now = (Time.now.to_f * 1000).to_i
    out = "LQ".b + [1, 1, 0, logical_key.bytesize].pack("CCCn") + logical_key.b
    out << [now, now, now + max_age * 1000, swr, sie, 0, status, headers.size].pack("Q>Q>Q>NNCnn")
    headers.each { |name, value| out << [name.bytesize].pack("n") << name.b << [value.bytesize].pack("N") << value.b }
    out << [body.bytesize].pack("Q>") << body.b
    out << [Zlib.crc32(out)].pack("N")
  end

  # Writes pages to the server ketama places each on, with the TTL Lacquer itself would use.
  class Writer
    def initialize(servers, namespace: "lq", keep: 3600)
      @ring, @namespace, @keep = KetamaRing.new(servers), namespace, keep
      @clients = servers.to_h { |name| [name, Dalli::Client.new(name, socket_timeout: 1)] }
    end

    def write(host, path, body, status: 200, headers: [], max_age: 300, swr: 0, sie: 0)
      raise ArgumentError, "larger pages need chunks (docs/entry-format.md)" if body.bytesize + 16_384 > 1 << 20
      key = LacquerPages.memcached_key(host, path, @namespace)
      value = LacquerPages.encode_page(LacquerPages.primary_key(host, path), body, status: status,
                                       headers: headers, max_age: max_age, swr: swr, sie: sie)
      client(key).set(key, value, max_age + [swr, sie].max + @keep, raw: true) or raise "not stored: #{key}"
      key
    end

    # Removes the shared copy; nodes drop theirs after local_ttl (purge to drop them now).
    def delete(host, path)
      key = LacquerPages.memcached_key(host, path, @namespace)
      client(key).delete(key)
    end

    private

    def client(key) = @clients.fetch(@ring.server_for(key))
  end
end

# lacquer_pages.rb SERVERS HOST PATH MAX_AGE [Name:Value ...] < body
if $PROGRAM_NAME == __FILE__
  servers, host, path, max_age, *headers = ARGV
  headers = headers.map { |h| h.split(":", 2).map(&:strip) }
  puts LacquerPages::Writer.new(servers.split(",")).write(host, path, $stdin.binmode.read,
                                                           headers: headers, max_age: max_age.to_i)
end
