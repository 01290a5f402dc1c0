import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.ElectionNotNeededException;

/**
 * Moves the leader of every partition of the named topics to its other replica, again and again
 * (tests/support/kafka_cluster.py): reverse the replica order (the same replicas, so no data
 * moves), then a preferred-leader election. Prints one line per move; ends when stdin closes.
 *
 * <pre>java -cp kafka-libs/*:. LeaderFlipper host:port pause-ms topic [topic...]</pre>
 */
public final class LeaderFlipper {
    public static void main(String[] args) throws Exception {
        Map<String, Object> conf = new HashMap<>();
        conf.put("bootstrap.servers", args[0]);
        long pauseMs = Long.parseLong(args[1]);
        List<String> topics = List.of(args).subList(2, args.length);
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() != -1) { }
            } catch (Exception ignored) { }
            System.exit(0);
        });
        watcher.setDaemon(true);
        watcher.start();
        try (Admin admin = Admin.create(conf)) {
            while (true) {
                Map<TopicPartition, Optional<NewPartitionReassignment>> moves = new HashMap<>();
                Set<TopicPartition> partitions = new HashSet<>();
                for (TopicDescription topic : admin.describeTopics(topics).allTopicNames().get().values()) {
                    for (TopicPartitionInfo info : topic.partitions()) {
                        List<Integer> order = new ArrayList<>();
                        info.replicas().forEach(node -> order.add(node.id()));
                        if (order.size() < 2) continue;
                        Collections.reverse(order);
                        TopicPartition tp = new TopicPartition(topic.name(), info.partition());
                        moves.put(tp, Optional.of(new NewPartitionReassignment(order)));
                        partitions.add(tp);
                    }
                }
                admin.alterPartitionReassignments(moves).all().get();
                try {
                    admin.electLeaders(ElectionType.PREFERRED, partitions).all().get();
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof ElectionNotNeededException)) throw e;
                }
                System.out.println("moved the leaders of " + partitions.size() + " partitions");
                System.out.flush();
                Thread.sleep(pauseMs);
            }
        }
    }
}
